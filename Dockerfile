# One image for both daemons:  ghcr.io/sn-monitor/sn-monitor:0.1.0
#   docker build -t ghcr.io/sn-monitor/sn-monitor:0.1.0 .
# The agent container (deploy/kubernetes/agent-daemonset.yaml) runs it as root, for NVML's
# power limits and /dev/kmsg; the controller runs as the sn-monitor user below. NVML
# itself is not in the image: the NVIDIA container toolkit mounts the host driver's.
FROM python:3.12-slim

# Read-only root filesystem in the pods: write no bytecode at run time; logs unbuffered.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY sn_monitor ./sn_monitor
RUN pip install --no-cache-dir ".[kubernetes,kubelet]" \
    && rm -rf /src \
    && useradd --system --uid 10001 --user-group --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin sn-monitor

WORKDIR /
USER 10001:10001
EXPOSE 9847 9848
ENTRYPOINT ["sn-monitor"]
CMD ["--help"]
