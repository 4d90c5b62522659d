# One image for every process of deploy/docker-compose.yaml: the code server, the daemon, the
# webserver (and, with deploy/run_launcher.docker.yaml, the run containers). See deploy/README.md,
# "Docker". Build from the project folder: docker build -t fieldsales-dagster .
FROM python:3.12-slim

WORKDIR /opt/fieldsales
# What `pip install` needs: the package, its metadata (pyproject.toml names README.md as readme).
COPY pyproject.toml README.md ./
COPY fieldsales_dagster ./fieldsales_dagster
# The install line of deploy/README.md ("Install"), without -e: the image holds a fixed copy.
RUN pip install --no-cache-dir '.[production]'

# The instance (PostgreSQL storage from DAGSTER_POSTGRES_URL) and the workspace that points the
# webserver and the daemon at the code server.
ENV DAGSTER_HOME=/opt/dagster/dagster_home
COPY deploy/dagster.yaml /opt/dagster/dagster_home/dagster.yaml
COPY deploy/workspace.docker.yaml /opt/fieldsales/workspace.docker.yaml

# The lake (its SQLite catalog and its Parquet files), the optional single-file export and the
# token store live on a volume mounted here (FIELDSALES_DUCKLAKE_CATALOG, FIELDSALES_DUCKDB_PATH,
# FIELDSALES_TOKEN_STORE). Runs write as this user, never as root.
RUN useradd --create-home --uid 1000 fieldsales && mkdir -p /data \
    && chown fieldsales /data /opt/dagster/dagster_home
USER fieldsales

# By default the container is the code server (service "code" of deploy/docker-compose.yaml); the
# webserver and the daemon give their own command. Its port is for them only: a private network.
CMD ["dagster", "code-server", "start", "-h", "0.0.0.0", "-p", "4000", "-m", "fieldsales_dagster"]
