"""The one conversation form every API is read into and written from (pure): the request
(``ChatRequest``), its messages as LangChain messages and Chat Completions JSON, what rides
along from the API a message came in (``wire``), settings crossing APIs (``params``).
"""
