"""The one way a check says no: ``raise Refuse(reason)``; the reason is the near miss's text."""


class Refuse(Exception):
    """Raised by a rule's ``analyse`` (or any check it calls, at any depth) to refuse a match;
    the message is the near-miss reason. ``covers``: the nodes the refused fusion would have
    taken, when the rule looked past its structural match (a fan-out rule's region): the near
    miss names them, so no site signature reports the same site again."""

    def __init__(self, reason: str = "", *, covers=()):
        super().__init__(reason)
        self.covers = tuple(covers)


class NotCandidate(Refuse):
    """Raised by ``analyse`` for a structural match that is not worth reporting at all (the
    rule's pattern is looser than what it models, and another rule reports the site)."""
