"""Benchmarks of the keeper proxy: what it costs per call (``cost``), its heap between calls
(``heap``), a benchmark stream through it (``stream_run``), and side by side with its upstream
called directly (``vs_direct``); ``servers`` starts the proxy and an instant upstream in
processes of their own so their CPU and memory are read apart from the agents'.
"""
