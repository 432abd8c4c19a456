"""The upstream side: the HTTP client, retries, the upstream's server-sent events, and the API the
upstream speaks.
"""
