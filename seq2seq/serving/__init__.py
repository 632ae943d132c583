"""Serving trained models: the FastAPI app (the attention-explorer page, page.html, and the JSON API),
the batcher that queues requests per model and setting, and the checks of what a request may hold.

May import: seq2seq.decoding and the layers below it; never seq2seq.training or seq2seq.study.
"""
