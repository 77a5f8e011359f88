"""The gRPC door (`whisperq grpc`, docs/clients/grpc.md): the service whisperq.v1.Transcription
of web/rpc/proto/whisperq/v1/transcription.proto, a way in like `POST /v1/jobs` and MQTT.

- ``service`` - the calls: each builds a door Submission (models.pipeline.door) and submits it
  through models.pipeline.intake, or reads, cancels and watches a job, as web.api does;
- ``auth`` - who is calling: the `authorization: Bearer wq_...` metadata, as web.auth decides;
- ``errors`` - the service's errors as gRPC status codes (by their HTTP status), with retry info;
- ``jobs`` - a job as the Job message: GET /v1/jobs/<id>'s body under the same names;
- ``server`` - the server: TLS, the health service, reflection, `serve`;
- ``protoc`` - `make proto`: the stubs in ``v1/`` (generated, checked in) from the .proto.

The package is not named `grpc`, which would shadow the library.
"""
