# netskel: one image for controller, analyzer and the agent sidecar.
# docker build -t netskel:dev .
FROM python:3.11-slim
# pyverbs: the agent's RDMA prober, used wherever the pod gets a device
# (rdma/hca); scripts/install_pyverbs.sh says why it is unpacked, not installed.
COPY scripts/install_pyverbs.sh /tmp/install_pyverbs.sh
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      iproute2 ethtool openvswitch-common \
 && /tmp/install_pyverbs.sh python3 /opt/pyverbs \
 && rm -rf /var/lib/apt/lists/* /tmp/install_pyverbs.sh
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
