"""``keeper-bench notes-cost``: the notes arm's cost per 100K stream tokens in each tenth of a run
(``command``), which calls fall in which tenth and after the stream (``tenths``), what each
tenth is made of (``breakdown``, ``--explain``), the keeper's CPU and the phase each second of it
went to (``clock``, ``phases``), and several runs of a size combined into a median keeper CPU
(``repeats``, ``--repeat N``).
"""
