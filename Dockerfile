# The durable-agent image: the worker (its default command), the CLI (encryption at rest
# included), Flower, the web console, the metrics exporter (and tracing) and the test
# servers of the compose demo profile. Built on Debian's Python, so it needs no Python base
# image: `docker compose build` here, or `docker build -t durable-agent .`.
FROM debian:bookworm-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/durable-agent \
 && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin agent

ENV PATH=/opt/durable-agent/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# the dependencies first (from pyproject.toml), so that a change to the code does not
# reinstall them; then the package itself
COPY pyproject.toml ./
RUN python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
extras = p['optional-dependencies']; \
print('\n'.join(p['dependencies'] + extras['testing'] + extras['flower'] + extras['console'] + extras['metrics'] + extras['otel'] + extras['encryption']))" > requirements.txt \
 && pip install -r requirements.txt
COPY README.md ./
COPY durable_agent ./durable_agent
COPY workers ./workers
RUN pip install --no-deps . && rm -rf /src

WORKDIR /
USER agent
ENTRYPOINT ["durable-agent"]
CMD ["worker"]
