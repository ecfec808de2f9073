"""KEDA's external scaler messages, generated from externalscaler.proto (`make protos`)."""
