"""Graph I/O (model_io), the graph index (graph), the pattern language and matcher (pattern),
rules (rule) and the pass manager (passes)."""
