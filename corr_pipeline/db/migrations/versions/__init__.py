"""One module per schema revision (``rNNNN_*.py``, revision id ``"NNNN"``), oldest first."""
