# The babysitter node agent image (exporters/node-agent-daemonset.yaml runs it).
#
#   docker build -t registry.example.com/ml/babysitter-node-agent:0.1.0 .
#
# Two stages: the build stage installs the project and nvidia-ml-py into a virtual environment; the
# runtime stage copies only that environment onto the same slim Python base, so no build tools,
# pip cache or sources ship. NVML itself (libnvidia-ml.so) is NOT in the image: the NVIDIA container
# toolkit mounts the host driver's library at start (NVIDIA_DRIVER_CAPABILITIES=utility below), so
# the library always matches the host's kernel module. Build and run instructions, and what was and
# was not tested: exporters/README.md, "The node agent image".
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY src ./src
RUN python -m venv /opt/babysitter \
    && /opt/babysitter/bin/pip install --no-cache-dir ".[nvml]"

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="babysitter-node-agent" \
      org.opencontainers.image.description="babysitter node agent: GPU health, Xid errors, storage probe, trainer metrics" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/babysitter /opt/babysitter
# A system user for the image's default; the DaemonSet runs the agent as root with every capability
# dropped but SYSLOG, because /dev/kmsg (Xids logged while no agent ran) needs both. Without the
# kernel log (NVML events only), keep this user.
RUN groupadd --system --gid 65532 babysitter \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin babysitter
ENV PATH=/opt/babysitter/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
USER 65532:65532
# The agent listens on loopback unless told otherwise (BABYSITTER_NODE_LISTEN_ADDRESS=<node ip>:9946).
EXPOSE 9946
ENTRYPOINT ["babysitter"]
CMD ["node-agent"]
