"""The otfuse ONNX domain every fused node is in, its opset version, and otfuse's own version
(recorded in the models it writes). The bottom layer: every module may import it, it imports
nothing of otfuse."""

OP_DOMAIN = "otfuse"
OP_DOMAIN_VERSION = 1
VERSION = "0.1.0"  # also pyproject.toml's [project] version
