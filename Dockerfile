# netskel: one image for controller, analyzer and the agent sidecar.
# docker build -t netskel:dev .
FROM python:3.11-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      iproute2 ethtool openvswitch-common \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/netskel
COPY pyproject.toml README.md ./
COPY netskel netskel
COPY controller controller
COPY probe_agent probe_agent
COPY analyzer analyzer
COPY testbed testbed
RUN pip install --no-cache-dir .
# Unprivileged by default; the agent sidecar adds NET_RAW in its pod spec.
USER 65532:65532
ENTRYPOINT ["netskel"]
CMD ["--help"]
