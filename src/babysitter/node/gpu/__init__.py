"""GPU health: the collector (``collector``) over an NVML-shaped backend: real NVML (``nvml``), DCGM
(``dcgm``), or the fake (``fake``) that the simulator (``simulate``) drives in tests and the demo."""
