"""The repair marathon: a real-code workload for context managers.

more-itertools 10.7.0 (from the package registry, at install time) gets seeded one-token defects,
each checked to make exactly its own tests fail; an agent with one shell tool works them as
tickets, one command per turn, while three notices add standing instructions and a last ticket
asks about the oldest work. The same agent runs directly, with the keeper middleware, and through
the keeper proxy; the grader counts fixed and clean tickets, regressions and the audit answer, and
audits the NOTES against the notices.

    keeper-bench marathon-fetch                  # once, at install time (make setup does it)
    keeper-bench marathon --model scripted       # plumbing run (the scripted agent), all ways
    keeper-bench marathon --model openai:http://127.0.0.1:8080/v1:qwen3 --ways middleware,proxy
"""
