# One image for the API and the workers:
#   docker run IMAGE                          -> resnet-service api --host 0.0.0.0
#                                                (HTTP on 8000, the inference protocol's gRPC on 8001)
#   docker run --gpus 1 IMAGE resnet-service worker
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ARTIFACT_DIR=/data/artifacts \
    DATA_DIR=/data/datasets

WORKDIR /app

# Dependencies first, each in its own layer: they change far less often than the source.
# torch and torchvision at the releases the project is tested with (the CUDA wheels).
RUN pip install torch==2.14.1 torchvision==0.29.1
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# The source. Editable, so that migrations/ and alembic.ini stay beside the code.
COPY . .
RUN pip install --no-deps -e . \
    && groupadd --gid 10001 resnet \
    && useradd --uid 10001 --gid 10001 --create-home resnet \
    && mkdir -p /data/artifacts /data/datasets \
    && chown -R 10001:10001 /data

USER 10001:10001
VOLUME ["/data/artifacts"]
EXPOSE 8000 8001

# For the API (the default command); docker-compose.yml gives workers their own check.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/api/v1/healthz', timeout=4)"]

# X-Forwarded-For is ignored unless FORWARDED_ALLOW_IPS names the proxy in front.
CMD ["resnet-service", "api", "--host", "0.0.0.0", "--port", "8000", "--grpc-port", "8001"]
