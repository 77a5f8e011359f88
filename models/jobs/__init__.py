"""Jobs: the record that is the source of truth, and everything that changes it.

- ``record`` - the Job row, its status and stage enums.
- ``operations`` - create, look up, finish exactly once, cancel, delete.
- ``claims`` - the inference claim: one engine run at a time per job, across processes and
  hosts (a lease, renewed while it runs, and a fencing token checked when the transcript is stored).
- ``batches`` - many jobs submitted together (POST /v1/batches), read and followed together.
- ``corrections`` - a client's correction of a finished transcript, kept beside it.
- ``idempotency``, ``deadletter``, ``sweeper`` - the same request twice, jobs that used up
  their attempts, jobs whose message or worker was lost.
- ``shadows`` - a shadow model's transcripts of a job, scored against the job's own (word
  error rate) and compared per model pair.
- ``analyses`` - the analyses a job asked for (models.analysis), each run once after its
  transcript is stored, merged into it, and the job finished then.
- ``ledger`` - every pass of the engine over a job's windows and how it ended, written
  where the engine runs: what "inference runs once per job" is checked on.
- ``workers`` - heartbeats; ``throughput`` - the speed an inference worker's batches reach,
  which its heartbeat carries; ``eta`` - a job's place and finish estimate; ``metrics`` -
  worker-side metrics.

May import config, the foundation (``models.storage`` among it), ``models.security``,
``models.analysis`` and ``models.speech`` (a transcript's shape); never registry, access,
delivery, pipeline or maintenance."""
