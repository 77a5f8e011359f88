"""Work over every store at once, on a schedule or by an operator: ``retention`` (delete what
finished jobs no longer need) and ``rotation`` (re-encrypt under the active key).

May import every other package of models."""
