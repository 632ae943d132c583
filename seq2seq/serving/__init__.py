"""Serving trained models: the FastAPI app (server.py: the attention-explorer page, page.html, and the
JSON API), the batcher that queues requests per model and setting (batcher.py), the checks of what
a request may hold (requests.py), of the work it would cost (budget.py) and of the Host it names
(hosts.py), and the writing of answers (answers.py).

May import: seq2seq.decoding and the layers below it; never seq2seq.training or seq2seq.study.
"""
