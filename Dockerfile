# syntax=docker/dockerfile:1
# The image the Helm chart (charts/agents) runs: `joch server`, and the same `joch runner` the
# Kubernetes Job runtime starts in each run's pod.
#
# Two stages. `build` installs the pinned dependencies (requirements.lock, as `make run` does) and
# joch itself (no dependencies, no build isolation: nothing unpinned is fetched) into a virtualenv
# at /opt/joch. The final stage holds that virtualenv, Python, git (runs clone repositories and diff
# their worktrees), bubblewrap (the local sandbox, where the node allows it) and tini (reaps the
# runners' orphans), and runs as uid/gid 10001, the chart's podSecurityContext. Nothing in it needs
# a writable root filesystem: state goes to /var/lib/joch (the data volume), HOME and TMPDIR to /tmp.
#
#   docker build -t joch:dev .
#   docker run --rm -p 8080:8080 -v "$PWD/tokens:/etc/joch/tokens:ro" joch:dev \
#     server --host 0.0.0.0 --token-file /etc/joch/tokens
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/joch
COPY requirements.lock /src/requirements.lock
RUN /opt/joch/bin/pip install -r /src/requirements.lock
COPY pyproject.toml README.md LICENSE /src/
COPY src /src/src
RUN /opt/joch/bin/pip install --no-deps --no-build-isolation /src \
    && /opt/joch/bin/joch server --help > /dev/null \
    && /opt/joch/bin/joch runner --help > /dev/null

FROM ${PYTHON_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends git ca-certificates openssh-client bubblewrap tini \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 joch \
    && useradd --uid 10001 --gid 10001 --home-dir /var/lib/joch --no-create-home --shell /usr/sbin/nologin joch \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/joch
COPY --from=build /opt/joch /opt/joch
ENV PATH=/opt/joch/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp
USER 10001:10001
WORKDIR /var/lib/joch
EXPOSE 8080
ENTRYPOINT ["tini", "--", "joch"]
# On an address other than loopback the server needs --token-file or --oidc-issuer-url: the chart
# passes them (its `args` replace this CMD).
CMD ["server", "--host", "0.0.0.0", "--data-dir", "/var/lib/joch"]
