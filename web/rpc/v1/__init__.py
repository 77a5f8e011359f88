"""Generated from web/rpc/proto/whisperq/v1/transcription.proto by `make proto`: do not edit."""
