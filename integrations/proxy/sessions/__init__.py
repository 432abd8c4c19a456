"""The session engine: which tenant a call belongs to, each session's record and counters, a
request's history aligned with the session, the keeper step and the upstream calls of a turn.
"""
