"""One validated settings object, read from the environment (and `.env`) once."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    """Every setting of the service; the README has the table."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore")

    database_url: str = Field(
        "sqlite:///var/resnet.db",
        description="SQLAlchemy URL; postgresql+psycopg://... in production.",
    )
    broker_url: str = Field(
        "sqla+sqlite:///var/broker.db", description="Celery broker; redis://... in production."
    )
    data_dir: Path = Field(Path("var/data"), description="Where datasets are looked up.")
    artifact_dir: Path = Field(Path("var/artifacts"), description="Checkpoints and run files.")
    artifact_store: Literal["local", "s3"] = Field(
        "local",
        description="Where artifacts are kept: local (under ARTIFACT_DIR) or s3 (the bucket "
        "S3_BUCKET of an S3-compatible object store).",
    )
    s3_endpoint_url: str | None = Field(
        None, description="The object store's URL (MinIO, Ceph, ...); default: AWS S3."
    )
    s3_bucket: str = Field(
        "resnet-artifacts", description="The artifacts' bucket; created at first use if missing."
    )
    s3_region: str = Field("us-east-1", description="The object store's region.")
    s3_access_key_id: str | None = Field(
        None, description="The object store's access key; default: boto3's credential chain."
    )
    s3_secret_access_key: SecretStr | None = Field(
        None, description="The secret of S3_ACCESS_KEY_ID."
    )
    artifact_cache_dir: Path = Field(
        Path("var/cache"),
        description="Where artifacts fetched from the object store are kept for reuse.",
    )
    artifact_cache_bytes: int = Field(
        10 * 1024**3,
        ge=0,
        description="Most bytes ARTIFACT_CACHE_DIR keeps; beyond, the least recently used "
        "go (the one just fetched always stays).",
    )
    allow_downloads: bool = Field(
        False, description="Let torchvision download CIFAR/MNIST into DATA_DIR when missing."
    )
    auth_enabled: bool = Field(True, description="Require API keys (Authorization: Bearer ...).")
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host names (optionally host:port; .example.com for its subdomains; * for "
        "any) the API answers to, comma-separated. Empty: any host with auth on; with auth off "
        "only the loopback names at the server's own port (127.0.0.1, localhost, [::1]).",
    )
    rate_limit_submits_per_minute: float = Field(
        60.0,
        ge=0,
        le=100_000,
        description="Submits (POST jobs, studies, dataset uploads) per minute per API key, or "
        "per client address with auth off; 0 turns the limit off. Beyond it, 429.",
    )
    rate_limit_submit_burst: int = Field(
        20, ge=1, le=10_000, description="Submits allowed at once before the rate applies."
    )
    forwarded_allow_ips: str = Field(
        "",
        description="Proxies whose X-Forwarded-For and X-Forwarded-Proto the API trusts "
        "(addresses or networks, comma-separated; * for any). Empty: none, so a caller's "
        "address (its per-caller limits) is the connection's.",
    )
    header_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=300,
        description="A connection whose request headers are not all in within this time is closed.",
    )
    body_timeout_seconds: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="A request body that sends nothing for this long is refused (408) and its "
        "connection closed.",
    )
    max_connections: int = Field(
        1024,
        ge=1,
        le=1_000_000,
        description="Open connections and requests of this API process; beyond, a new request "
        "is 503.",
    )
    stream_max_per_key: int = Field(
        8, ge=1, le=1000, description="Open event streams per API key (or client); beyond, 429."
    )
    stream_max_total: int = Field(
        256, ge=1, le=100_000, description="Open event streams of this API process; beyond, 503."
    )
    stream_max_seconds: float = Field(
        3600.0,
        ge=1,
        le=86_400,
        description="Longest life of one event stream; it then ends and the client resumes "
        "with Last-Event-ID.",
    )
    auth_cache_seconds: float = Field(
        2.0,
        ge=0,
        le=300,
        description="How long an API process reuses a key's check; a revocation through "
        "another API process takes effect within this time (through this one, at once).",
    )
    reads_owner_only: bool = Field(
        False,
        description="Lists and reads of jobs, studies, uploads and registered models show a "
        "key only its own (admin keys see all); another's is 404. Off: every read key reads "
        "all.",
    )
    lease_seconds: int = Field(60, ge=5, description="A running job's lease; heartbeats renew it.")
    heartbeat_seconds: float = Field(5.0, gt=0, description="How often a worker renews its lease.")
    max_attempts: int = Field(3, ge=1, le=20, description="Deliveries before a job fails.")
    max_job_seconds: int = Field(
        7 * 24 * 3600, ge=60, description="Longest allowed job; time limits derive from it."
    )
    max_study_jobs: int = Field(
        1000, ge=1, le=100_000, description="Most jobs (cells x seeds) one study may have."
    )
    # Admission counts each net family (a net apart from its depth, on one data shape) on
    # the meta device: about a second of API CPU each. The presets need at most 11.
    max_study_net_families: int = Field(
        16, ge=1, le=1000, description="Most net families one study's cells may have."
    )
    max_versions_per_job: int = Field(
        20, ge=1, le=10_000, description="Most registered versions made of one job (409 beyond)."
    )
    max_upload_bytes: int = Field(512 * 1024**2, ge=1024, description="Dataset upload limit.")
    import_max_bytes: int = Field(
        1024**3, ge=1024, description="Largest weights file an import takes (413 beyond)."
    )
    # An export runs in a process of its own; ResNet-1202's ONNX export took 200 s on a busy
    # CPU, ResNet-20's 3 s.
    export_timeout_s: float = Field(
        1800, gt=0, description="How long a version's export may run before it is stopped."
    )
    exports_per_key: int = Field(
        2, ge=1, le=64, description="Exports a key makes at once (429 beyond); one per version."
    )
    # Admission budgets of a train job, checked on submission (422) and by the worker on
    # the real data; the defaults let the papers' nets through at the papers' recipes,
    # ImageNet ResNet-200 at batch 256 for 600k iterations included (62 GiB, 2.3e18 MACs).
    max_model_params: int = Field(
        200_000_000,
        ge=1_000,
        le=10**12,
        description="Most parameters a job's net may have (ResNet-200: 64.7M).",
    )
    max_train_memory_bytes: int = Field(
        128 * 1024**3,
        ge=1024**2,
        le=2**50,
        description="Most estimated training memory a job may need: batch x activations "
        "kept for backward (float32) + parameters, gradients and optimizer state.",
    )
    max_job_macs: float = Field(
        1e19,
        ge=1e6,
        le=1e24,
        description="Most compute a job may ask for: forward MACs per image x batch size x "
        "iterations.",
    )
    upload_max_unpacked_bytes: int = Field(
        4 * 1024**3, ge=1024, description="Most bytes one uploaded archive may unpack to (413)."
    )
    upload_max_ratio: float = Field(
        100.0,
        ge=1,
        le=100_000,
        description="Most unpacked bytes per archive byte (images barely compress; a zip "
        "bomb unpacks to thousands of times its size); beyond it, 413.",
    )
    upload_quota_bytes: int = Field(
        20 * 1024**3,
        ge=1024,
        description="Disk bytes (whole blocks, folders included) of the unpacked uploads one "
        "owner (API key; with auth off, everyone as one) may keep; an upload past it is 413 "
        "until some are deleted.",
    )
    upload_quota_files: int = Field(
        200_000,
        ge=1,
        description="Files of the unpacked uploads one owner may keep (each costs an inode "
        "and a block, whatever its size); an upload past it is 413 until some are deleted.",
    )
    max_artifact_bytes_per_owner: int = Field(
        100 * 1024**3,
        ge=0,
        description="Bytes of job files (checkpoints, result files) and exports one owner "
        "(API key; with auth off, everyone as one) may keep, as stored; 0: unlimited. A train "
        "job whose keep_last checkpoints alone would not fit is refused (422); a run prunes "
        "its own older checkpoints to fit, or fails naming the usage.",
    )
    checkpoint_free_margin_bytes: int = Field(
        64 * 1024**2,
        ge=0,
        le=1024**4,
        description="Free disk space a checkpoint write leaves beyond the checkpoint's own "
        "size; with less free, the write is refused before it starts and the job fails.",
    )
    device: str | None = Field(None, description="Worker device (cuda:0, cpu); default: auto.")
    migrate_on_start: bool = Field(
        False, description="Migrate the database when the API starts (the embedded mode)."
    )
    max_request_bytes: int = Field(
        1024**2, ge=1024, description="Body limit of every request but dataset uploads."
    )
    stream_poll_seconds: float = Field(
        0.5, gt=0, le=10, description="How often an event stream polls the database."
    )
    probe_timeout_seconds: float = Field(
        2.0, gt=0, le=30, description="Readiness: how long the database and broker may take."
    )
    client_url: str = Field(
        "http://127.0.0.1:8000",
        validation_alias=AliasChoices("client_url", "resnet_url"),
        description="The service the command-line client talks to (RESNET_URL).",
    )
    client_key: str | None = Field(
        None,
        validation_alias=AliasChoices("client_key", "resnet_key"),
        description="The command-line client's API key (RESNET_KEY).",
    )
    predict_max_image_bytes: int = Field(
        4 * 1024**2, ge=1024, description="Largest image file a prediction accepts (413)."
    )
    predict_max_pixels: int = Field(
        16_000_000, ge=64, description="Most pixels an image may declare; checked before decoding."
    )
    predict_max_files: int = Field(16, ge=1, le=256, description="Most images in one request.")
    predict_cache_models: int = Field(4, ge=1, description="Loaded models kept (LRU).")
    predict_cache_bytes: int = Field(
        2 * 1024**3, ge=1024**2, description="Parameter bytes of the loaded models kept (LRU)."
    )
    predict_max_batch: int = Field(
        64, ge=1, le=1024, description="Images per forward pass; 1 turns micro-batching off."
    )
    predict_max_wait_ms: float = Field(
        0.0,
        ge=0,
        le=1000,
        description="How long a batch waits for more requests to join after its first. At 0 "
        "a batch takes the requests already waiting (under load, those that arrived during "
        "the previous forward pass), so a lone request is never held back.",
    )
    predict_queue_size: int = Field(
        1024, ge=1, description="Requests waiting per model; beyond it, 503 with Retry-After."
    )
    predict_max_starting: int = Field(
        2,
        ge=1,
        le=64,
        description="Model processes an API process starts at once; a request for another "
        "model not yet loaded waits its turn (503 with Retry-After past the start timeout).",
    )
    predict_threads: int = Field(
        0,
        ge=0,
        description="Intra-op threads of each model process's forward pass (batches of 8 "
        "images or more; smaller ones use one); 0: the cores but one (the API's), shared "
        "by the replicas, at least one.",
    )
    predict_fold_batch_norm: bool = Field(
        True,
        description="Serve each net with the batch norms that follow convolutions folded "
        "into them, in channels_last (1.6x the images/s of ResNet-20 on a CPU core); its "
        "probabilities then equal the evaluation engine's up to float rounding (under "
        "1e-6), not bit for bit.",
    )
    predict_replicas: int = Field(
        1,
        ge=0,
        le=64,
        description="Processes serving each loaded model, each batching (a request goes to "
        "the least busy); 0: two on a machine of two cores or more, else one.",
    )
    predict_backend: Literal["auto", "torch", "onnxruntime", "onnxruntime_int8"] = Field(
        "auto",
        description="What runs a model process's forward passes: torch (the folded PyTorch "
        "net), onnxruntime (that net exported to ONNX in memory, checked within 1e-4 of "
        "torch's probabilities, run by ONNX Runtime on the CPU, or by its CUDA provider "
        "with PREDICT_DEVICE=cuda where onnxruntime-gpu is installed) or onnxruntime_int8 "
        "(the version's kept onnx_int8 export on the CPU; a version without one is refused "
        "with 409); auto: onnxruntime on the CPU (ResNet-20 here: 1.1x to 2.4x torch's "
        "images/s, 1.8x to 2x its requests/s served), torch on a GPU or in bf16/fp16.",
    )
    predict_precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32",
        description="The torch backend's precision: the net's weights cast to bf16 or fp16 "
        "(images normalised in fp32, then cast; softmax in fp32), once its probabilities on "
        "a seeded probe batch are within PREDICT_PRECISION_TOLERANCE of fp32's.",
    )
    predict_precision_tolerance: float = Field(
        0.05,
        gt=0,
        le=1,
        description="The most a bf16/fp16 net's probabilities may differ from fp32's on the "
        "probe batch when its model starts (ResNet-8 on digits: 9e-3 in bf16, 1.5e-3 in "
        "fp16); beyond it the model is refused (409) with the difference.",
    )
    predict_device: str = Field(
        "cpu",
        pattern=r"^(cpu|cuda(:\d+)?)$",
        description="Where model processes run their forward passes: cpu, cuda or cuda:N.",
    )
    predict_ref_ttl_ms: float = Field(
        1000.0,
        ge=0,
        le=60_000,
        description="How long an API process reuses a resolved model reference; a registry "
        "change made through another process reaches its predictions within this time.",
    )
    explain_max_images: int = Field(
        4, ge=1, le=64, description="Most images in one explanation request (413 beyond)."
    )
    explain_max_running: int = Field(
        2,
        ge=1,
        le=64,
        description="Explanations an API process computes at once; beyond, 503 with Retry-After.",
    )
    explain_cache_models: int = Field(
        1, ge=1, le=16, description="Explain processes (one per checkpoint) kept (LRU)."
    )
    explain_threads: int = Field(
        0,
        ge=0,
        description="Intra-op threads of each explain process; 0: the cores but one.",
    )
    grpc_port: int = Field(
        0,
        ge=0,
        le=65_535,
        description="The port of the Open Inference Protocol over gRPC, served by the API "
        "process beside HTTP; 0: off (`resnet-service api` and `up` serve it at 8001 unless "
        "GRPC_PORT or --grpc-port says otherwise).",
    )
    grpc_host: str = Field(
        "127.0.0.1",
        description="The interface the gRPC port binds (`resnet-service api` sets its --host).",
    )
    payload_log_sample: float = Field(
        0.0,
        ge=0,
        le=1,
        description="The share of predicted images whose payload (digest, answer, version, "
        "latency, time, caller) is logged to the artifact store; 0 logs none.",
    )
    payload_log_images: bool = Field(
        False, description="Keep each logged image itself too (a PNG in its record)."
    )
    payload_log_max_bytes: int = Field(
        64 * 1024**2,
        ge=1024,
        description="Bytes of payload segments kept per version; the oldest go beyond.",
    )
    payload_log_max_age_days: float = Field(
        30.0, gt=0, description="Payload segments older than this are deleted."
    )
    payload_log_batch: int = Field(
        512, ge=1, le=100_000, description="Logged records that make a segment be written."
    )
    payload_log_flush_seconds: float = Field(
        10.0, gt=0, le=3600, description="The longest a logged record waits to be written."
    )
    payload_log_buffer: int = Field(
        8192,
        ge=1,
        description="Records held in memory before they are written; beyond, they are "
        "dropped and counted (resnet_payload_log_dropped_total). As many again of those the "
        "store refused are kept to retry; beyond, the oldest are lost and counted "
        "(resnet_payload_log_lost_total).",
    )
    drift_enabled: bool = Field(
        True,
        description="Watch each served model's inputs and classes against its training data "
        "(`GET .../drift`); false installs no drift tap and the drift routes answer 409.",
    )
    drift_window_images: int = Field(
        1000, ge=1, le=1_000_000, description="Served images the drift statistics look back on."
    )
    drift_window_seconds: float = Field(
        3600.0, gt=0, description="The longest the drift statistics look back (seconds)."
    )

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: object) -> object:
        """ALLOWED_HOSTS as a comma-separated list (a list passes as is)."""
        if isinstance(value, str):
            return [host.strip().lower() for host in value.split(",") if host.strip()]
        return value


@lru_cache
def get_settings() -> Settings:
    """The process's settings, validated on first use."""
    return Settings()
