"""The fabric: InfiniBand/RoCE ports, PCIe links and AER, and which NIC each GPU uses (docs/fabric.md)."""
