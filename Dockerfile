# syntax=docker/dockerfile:1
# egress-proxy container image.
#
#   docker build -t egress-proxy:0.1.0 .
#
# Runs as uid/gid 10001 with a read-only root filesystem: the only writable path
# it needs is --confdir (the CA and mitmproxy's dhparam file), mounted at
# /var/lib/egress-proxy (an emptyDir in the Helm chart). `nft` is included for
# `egress-proxy redirect-rules --apply`, the transparent-mode init container.
#
# The base is pinned by version; release builds should also pin its digest
# (python:3.12.12-slim-bookworm@sha256:...), which cannot be looked up offline.
ARG PYTHON_IMAGE=python:3.12.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
RUN pip install --isolated "setuptools==84.2.1" "wheel==0.48.0" "build==1.6.1"
COPY pyproject.toml README.md ./
COPY egress ./egress
RUN python -m build --wheel --no-isolation --outdir /dist .
COPY docker/constraints.txt /constraints.txt
# Every dependency, direct and transitive, at the version the tests ran with.
RUN python -m venv /opt/egress-proxy \
 && /opt/egress-proxy/bin/pip install --isolated -c /constraints.txt /dist/egress_proxy-*.whl \
 && find /opt/egress-proxy -path '*/site-packages/botocore/data' -prune -exec rm -rf {} +
# botocore/data (28 MB of service models) goes: the proxy uses only botocore's SigV4
# signer (egress.credentials.sigv4), which reads none of it; botocore is then 3.5 MB.

FROM ${PYTHON_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends nftables \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 egress \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/egress-proxy --no-create-home \
      --shell /usr/sbin/nologin egress \
 && install -d -o 10001 -g 10001 -m 0700 /var/lib/egress-proxy
COPY --from=build /opt/egress-proxy /opt/egress-proxy
ENV PATH=/opt/egress-proxy/bin:$PATH \
    HOME=/var/lib/egress-proxy \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
VOLUME ["/var/lib/egress-proxy"]
USER 10001:10001
EXPOSE 8080 9090
ENTRYPOINT ["egress-proxy"]
CMD ["run", "--spec", "/etc/egress-proxy/spec/spec.yaml", "--listen", "0.0.0.0:8080", \
     "--metrics-listen", "0.0.0.0:9090", "--confdir", "/var/lib/egress-proxy"]
