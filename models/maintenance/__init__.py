"""Work over every store at once, on a schedule or by an operator: ``retention`` (delete what
finished jobs no longer need), ``rotation`` (re-encrypt under the active key) and ``dataset``
(export the jobs collected as training data).

May import every package below it (speech, registry, jobs, access, delivery, the foundation
and security); never pipeline or runtime."""
