"""The one way a check says no: ``raise Refuse(reason)``; the reason is the near miss's text."""


class Refuse(Exception):
    """Raised by a rule's ``analyse`` (or any check it calls, at any depth) to refuse a match;
    the message is the near-miss reason."""


class NotCandidate(Refuse):
    """Raised by ``analyse`` for a structural match that is not worth reporting at all (the
    rule's pattern is looser than what it models, and another rule reports the site)."""
