"""The `resnet-service` command line."""
