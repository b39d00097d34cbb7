"""The host under the GPUs: EDAC memory errors and CPU thermal throttling (docs/fabric.md)."""
