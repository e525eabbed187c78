"""One settings object for the workers: environment variables prefixed ``REVAL_``
(e.g. ``REVAL_BROKER``, ``REVAL_REDIS_URL``), overridable by CLI flags.

No ``.env`` file is read implicitly (a stray file in the working directory must not
reconfigure a worker): name one with ``--env-file`` or ``REVAL_ENV_FILE``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import unquote, urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from stream.evaluation.scoring import DEFAULT_KS, DEFAULT_RS, parse_ints, r_label
from stream.synonyms.hubness import DEFAULT_METHOD, METHODS
from workers import redaction


def _durations(text: str) -> tuple[int, ...]:
    """``"5m,1h,24h"`` → seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        try:
            out.append(int(float(part[:-1]) * units[part[-1]]) if part[-1] in units else int(part))
        except (ValueError, KeyError):
            raise ValueError(f"{part!r} is not a duration like 30s, 5m, 1h, 1d") from None
    if not out:
        raise ValueError(f"no durations in {text!r}")
    return tuple(out)


def window_label(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


class Settings(BaseSettings):
    """Everything a worker needs; every field is ``REVAL_<NAME>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="REVAL_", extra="ignore")

    @classmethod
    def load(cls, env_file: str | Path | None = None, **overrides: Any) -> Settings:
        """The environment (and ``env_file``, else ``$REVAL_ENV_FILE`` when set), then ``overrides``."""
        chosen = env_file or os.environ.get("REVAL_ENV_FILE") or None
        if chosen is not None and not Path(chosen).is_file():
            raise ValueError(f"env file {chosen} does not exist")
        return cls(_env_file=chosen, **overrides)

    # Kafka
    broker: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers, host:port[,...]")
    app_id: str = Field("reval", description="Prefix of the consumer groups (one per role)")
    topic_tweets: str = Field("tweets", description="Input: tweets")
    topic_recommendations: str = Field("recommendations", description="Input: events")
    topic_scores: str = Field("scores", description="Output: one result per event")
    topic_dead_letter: str = Field("dead-letter", description="Rejected records")
    partitions: int = Field(4, ge=1, description="Partitions of tweets/recommendations/scores")
    input_retention_ms: int = Field(
        604_800_000,
        ge=-1,
        description="retention.ms the workers create tweets/recommendations with (-1: keep forever); "
        "time counts from each record's Kafka timestamp (a replay's: see `reval replay --timestamps`)",
    )
    input_retention_bytes: int = Field(
        -1, ge=-1, description="retention.bytes (per partition) of the created input topics (-1: no limit)"
    )
    session_timeout_s: float = Field(
        10.0, gt=0, description="Consumer group session timeout (Tansu joins after half of it)"
    )
    startup_timeout_s: float = Field(
        30.0, gt=0, description="How long a starting worker waits for the broker before it exits 1"
    )
    data_dir: Path = Field(Path("var/faust"), description="Faust's local state directory")
    replication: int = Field(1, ge=1, description="Replication factor of created topics")
    max_message_bytes: int = Field(
        1_000_000,
        ge=1024,
        description="Largest output record, key and overhead included (the producer's max_request_size)",
    )
    produce_timeout_s: float = Field(
        120.0, gt=0, description="Outputs not acknowledged this long: the worker stops (fail-stop)"
    )
    processing_guarantee: Literal["at_least_once", "exactly_once"] = Field(
        "at_least_once",
        description="Scores: at_least_once, or exactly_once (Kafka transactions; Apache Kafka only, "
        "read the scores with isolation.level=read_committed; refused on Tansu). See Guarantees",
    )
    kafka_security_protocol: str = Field(
        "PLAINTEXT", description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
    )
    kafka_sasl_mechanism: str = Field("PLAIN", description="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
    kafka_sasl_username: str | None = Field(None, description="SASL user name")
    kafka_sasl_password: SecretStr | None = Field(None, description="SASL password (never logged)")
    kafka_ssl_cafile: Path | None = Field(None, description="CA bundle to verify the brokers (TLS)")
    kafka_ssl_certfile: Path | None = Field(None, description="Client certificate (mutual TLS)")
    kafka_ssl_keyfile: Path | None = Field(None, description="Client key (mutual TLS)")

    # Redis
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="redis:// or rediss:// (TLS)")
    redis_prefix: str = Field("reval", description="Prefix of every Redis key")
    redis_cluster: bool = Field(False, description="Use a Redis Cluster client")
    redis_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest wait for one Redis reply or connection; beyond it (a network partition) "
        "the call fails and the batch waits for Redis as in an outage",
    )
    redis_replicas: int | None = Field(
        None,
        ge=0,
        description="Replicas of each master that must hold a batch's writes before it is acknowledged "
        "(WAIT; unset: 1 with REVAL_REDIS_CLUSTER, else 0; 0: off)",
    )
    redis_replica_timeout_s: float = Field(
        1.0, gt=0, description="Longest wait for the replicas before the batch is held and retried"
    )
    dedup_ttl_s: int = Field(7 * 86400, ge=60, description="Memory of retweet duplicates")
    means_fold_after: int = Field(
        8, ge=1, description="Records a hashtag's log holds before the embed worker folds it"
    )
    means_window_s: float = Field(
        6 * 3600.0, ge=0, description="Event-time window of the per-hashtag window means (0: none)"
    )
    means_recent_s: float = Field(
        86400.0, gt=0, description="Recent use that the index job compares with earlier use"
    )

    # Embedding
    model: str = Field("vinai/bertweet-base", description="Hub id, local path or 'minilm'")
    device: str = Field("auto", description="auto (CUDA if present), cpu, cuda")
    dtype: str = Field(
        "auto",
        description="auto (CPU: int8 with VNNI, else bf16, else fp32), int8, float32, bfloat16, float16",
    )
    pooling: str = Field("mean", description="mean (over tokens) or cls")
    embed_batch_size: int = Field(32, ge=1, description="Tweets per encoder batch")
    embed_max_wait_s: float = Field(1.0, gt=0, description="Max wait to fill a batch")
    token_budget: int | None = Field(
        None, ge=0, description="Tokens per packed encoder batch (unset: 32768 on CUDA, off on CPU; 0: off)"
    )
    tokenize_workers: int | None = Field(
        None, ge=0, description="Tokenising processes of the packed path (unset: CUDA min(8, cores/2), CPU 0)"
    )
    language_filter: bool = Field(True, description="Drop non-English tweets")
    prepare_workers: int = Field(
        0,
        ge=0,
        description="Processes that parse and clean the embed role's tweets (0: in the worker's thread; "
        "on a GPU machine about cores/2, beside the tokenising processes)",
    )

    # Index job
    index_dir: Path = Field(Path("var/thesaurus"), description="Versioned thesaurus store of the index job")
    index_interval_s: float = Field(60.0, gt=0, description="Index job period")
    index_min_changes: int = Field(1, ge=1, description="Rebuild only when this many hashtags changed")
    index_keep: int = Field(3, ge=1, description="Versions kept")
    thesaurus_source: Literal["redis", "dir"] = Field(
        "redis",
        description="Where scorers load versions: redis (the index job publishes there) or dir",
    )
    index_min_count: int = Field(1, ge=1, description="Min tweets per indexed hashtag")
    index_n_trees: int = Field(50, ge=1, description="Annoy trees")
    index_hubness: str = Field(
        DEFAULT_METHOD, description="Neighbour ranking: raw, center, csls, center+csls, mp (docs: Concepts)"
    )

    # Embedding drift test (stream.monitoring.mmd): the embed workers keep a bounded sample of tweet
    # embeddings per event-time bucket; the index job compares the last window with the one before.
    drift_sample_rate: float = Field(0.1, ge=0, le=1, description="Share of embedded tweets sampled")
    drift_sample_cap: int = Field(300, ge=2, description="Most sampled tweets per bucket")
    drift_bucket_s: int = Field(3600, ge=1, description="Event-time bucket of the samples (seconds)")
    drift_window_s: int = Field(86400, ge=1, description="Recent window (and reference before it)")

    # Thesaurus audit (stream.auditing.coherence, stream.auditing.audit): the embed workers keep a bounded
    # sample of tweets per hashtag; the index job scores each new version's synonym sets.
    coherence_reservoir: int = Field(20, ge=2, description="Tweets kept per hashtag for coherence")
    coherence_k: int = Field(10, ge=1, description="Synonyms per coherence cluster")
    coherence_sample: int = Field(200, ge=0, description="Hashtags scored per version (0: off)")
    coherence_min_tweets: int = Field(5, ge=2, description="Min sampled tweets of a scored hashtag")
    topic_votes: str = Field("votes", description="The audit's vote log (one partition)")

    # Scoring
    ks: str = Field(",".join(map(str, DEFAULT_KS)), description="Synonym counts k")
    rs: str = Field(",".join(map(str, DEFAULT_RS)), description="Top-r cut-offs")
    join_window_s: float = Field(300.0, gt=0, description="How long an event waits for its tweet")
    join_max_pending: int = Field(
        1_000_000, ge=1, description="Events waiting in the join before the scorer stops pulling"
    )
    join_max_event_bytes: int = Field(
        65_536, ge=256, description="Largest waiting event kept (larger: dead letter join_event_too_large)"
    )
    score_batch_size: int = Field(
        1024,
        ge=1,
        description="Events per batch of the score role (numpy passes and Redis round trips shared "
        "by more events: 256 cost ~1.2x the CPU per event; a crash redelivers up to a batch)",
    )
    event_key: str = Field(
        "tweet_id,recommender", description="Event fields that identify a duplicate event (comma list)"
    )
    event_dedup_window_s: int = Field(
        3600, ge=0, description="How long an event key is remembered (0: no de-duplication)"
    )
    max_future_skew_s: float = Field(
        600.0, ge=0, description="Events this far ahead of the clock stay out of the rolling windows"
    )
    max_lateness_s: float | None = Field(
        None, ge=0, description="Events this far behind the newest stay out of the windows (default: largest)"
    )
    detector_arl0: float = Field(
        100_000.0,
        ge=0,
        description="The change detector's false-alarm budget: in-control events per false alarm, "
        "per recommender (0: no detector)",
    )
    detector_k: int | None = Field(
        None, ge=0, description="The change detector's k, one of REVAL_KS (default: 10, else the largest)"
    )
    detector_r: str | None = Field(
        None, description="The change detector's r, one of REVAL_RS (default: 10, else the largest)"
    )
    detector_reference: int = Field(
        1000, ge=20, description="A recommender's first events that set the detector's in-control law"
    )
    reload_interval_s: float = Field(5.0, gt=0, description="How often to look for a new index")
    windows: str = Field("5m,1h,24h", description="Event-time rolling windows of the gauges")
    recommenders: str = Field("", description="Allowed recommender label values (comma list)")
    max_recommenders: int = Field(20, ge=1, description="Cap on distinct labels before 'other'")
    max_label_length: int = Field(64, ge=1, description="Longer recommender names are exported as 'other'")

    # Metrics
    metrics_port: int | None = Field(None, description="Prometheus port (default per role)")
    memory_report_s: float = Field(
        0.0,
        ge=0,
        description="Log RSS and RSS after malloc_trim every N seconds (0: off); with PYTHONTRACEMALLOC, "
        "also where Python's allocations grew (a diagnosis of a growing worker)",
    )
    metrics_host: str = Field(
        "127.0.0.1", description="Prometheus bind address (containers set 0.0.0.0 explicitly)"
    )

    def model_post_init(self, context: Any, /) -> None:
        # Whoever holds the settings holds their secrets: from here on no log record of this
        # process -- ours or a library's, at any level -- carries them (workers.redaction).
        redaction.register(*self.secret_values())

    def secret_values(self) -> list[str]:
        """The values that must never be printed: the SASL password and the Redis URL's
        password (as written in the URL and decoded)."""
        values = [self.kafka_sasl_password.get_secret_value() if self.kafka_sasl_password else ""]
        try:
            password = urlsplit(self.redis_url).password
        except ValueError:  # not a URL: the whole value may be the secret
            password = self.redis_url
        if password:
            values += [password, unquote(password)]
        return [value for value in values if value]

    @field_validator("kafka_security_protocol")
    @classmethod
    def _check_protocol(cls, value: str) -> str:
        allowed = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
        if value not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return value

    @field_validator("index_hubness")
    @classmethod
    def _check_hubness(cls, value: str) -> str:
        if value not in METHODS:
            raise ValueError(f"must be one of {', '.join(METHODS)}")
        return value

    @field_validator("ks", "rs", "windows")
    @classmethod
    def _check_lists(cls, value: str, info: object) -> str:
        name = getattr(info, "field_name", "")
        if name == "windows":
            _durations(value)
        else:
            parse_ints(value, allow_all=name == "rs")
        return value

    @model_validator(mode="after")
    def _check_detector(self) -> Settings:
        if self.detector_k is not None and self.detector_k not in self.k_values:
            raise ValueError(f"REVAL_DETECTOR_K={self.detector_k} is not one of REVAL_KS ({self.ks})")
        if self.detector_r is not None and self.detector_r not in map(r_label, self.r_values):
            raise ValueError(f"REVAL_DETECTOR_R={self.detector_r} is not one of REVAL_RS ({self.rs})")
        return self

    @property
    def detector_at(self) -> tuple[int, str]:
        """The (k, r label) the change detector watches."""
        labels = [r_label(r) for r in self.r_values]
        k = (
            self.detector_k
            if self.detector_k is not None
            else 10
            if 10 in self.k_values
            else max(self.k_values)
        )
        r = self.detector_r if self.detector_r is not None else "10" if "10" in labels else labels[-1]
        return k, r

    @property
    def k_values(self) -> tuple[int, ...]:
        return tuple(int(k) for k in parse_ints(self.ks) if k is not None)

    @property
    def r_values(self) -> tuple[int | None, ...]:
        return parse_ints(self.rs, allow_all=True)

    @property
    def window_seconds(self) -> tuple[int, ...]:
        return _durations(self.windows)

    @property
    def recommender_allowlist(self) -> tuple[str, ...]:
        return tuple(r.strip() for r in self.recommenders.split(",") if r.strip())

    @property
    def event_key_fields(self) -> tuple[str, ...]:
        return tuple(f.strip() for f in self.event_key.split(",") if f.strip())

    def replicas_required(self) -> int:
        """``redis_replicas``, or its default: 1 on a Redis Cluster (the failover guarantee), 0
        on a single Redis (no replicas to wait for)."""
        if self.redis_replicas is not None:
            return self.redis_replicas
        return 1 if self.redis_cluster else 0

    def kafka_client_options(self) -> dict[str, Any]:
        """TLS / SASL options as kafka-python names them (the admin client, replays)."""
        out: dict[str, Any] = {"security_protocol": self.kafka_security_protocol}
        if self.kafka_security_protocol.startswith("SASL"):
            out["sasl_mechanism"] = self.kafka_sasl_mechanism
            out["sasl_plain_username"] = self.kafka_sasl_username
            out["sasl_plain_password"] = (
                self.kafka_sasl_password.get_secret_value() if self.kafka_sasl_password else None
            )
        for name in ("cafile", "certfile", "keyfile"):
            value = getattr(self, f"kafka_ssl_{name}")
            if value is not None:
                out[f"ssl_{name}"] = str(value)
        return out

    def faust_options(self) -> dict[str, Any]:
        """The same for Faust (``broker_credentials``)."""
        import ssl

        import faust

        protocol = self.kafka_security_protocol
        if protocol == "PLAINTEXT":
            return {}
        context = None
        if protocol.endswith("SSL"):
            context = ssl.create_default_context(
                cafile=str(self.kafka_ssl_cafile) if self.kafka_ssl_cafile else None
            )
            if self.kafka_ssl_certfile:
                context.load_cert_chain(
                    str(self.kafka_ssl_certfile),
                    str(self.kafka_ssl_keyfile) if self.kafka_ssl_keyfile else None,
                )
        if protocol.startswith("SASL"):
            password = self.kafka_sasl_password.get_secret_value() if self.kafka_sasl_password else ""
            return {
                "broker_credentials": faust.SASLCredentials(
                    username=self.kafka_sasl_username or "",
                    password=password,
                    mechanism=self.kafka_sasl_mechanism,
                    ssl_context=context,
                )
            }
        return {"broker_credentials": faust.SSLCredentials(context)}

    def aiokafka_options(self) -> dict[str, Any]:
        """The same for aiokafka (the score role's consumer and producers), as Faust converts
        its ``broker_credentials``."""
        from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

        return dict(credentials_to_aiokafka_auth(self.faust_options().get("broker_credentials")))

    def topics(self) -> dict[str, int]:
        """Topic → partition count; declared explicitly (Tansu/Faust need matching counts)."""
        return {
            self.topic_tweets: self.partitions,
            self.topic_recommendations: self.partitions,
            self.topic_scores: self.partitions,
            self.topic_dead_letter: 1,
        }

    def topic_configs(self) -> dict[str, dict[str, str]]:
        """The settings topics are created with: the input topics' retention."""
        retention = {
            "retention.ms": str(self.input_retention_ms),
            "retention.bytes": str(self.input_retention_bytes),
        }
        return {self.topic_tweets: retention, self.topic_recommendations: dict(retention)}


# -- what each part reads ------------------------------------------------------------------
# One environment, one validated object (REVAL_* names are the operators' contract), but each
# role and store states the settings it reads as a read-only view: a class typed with one of
# these can read nothing else (mypy checks it), and a new setting shows where it is used.
# The composition roots (Runtime, the roles' register functions, the CLI) hold the whole
# Settings and hand each part its view.


class KafkaSettings(Protocol):
    """What the Kafka clients of a worker -- the batch consumer, the transactional producer --
    read (workers.service.consumer, workers.service.transactions)."""

    @property
    def broker(self) -> str: ...
    @property
    def max_message_bytes(self) -> int: ...
    @property
    def session_timeout_s(self) -> float: ...
    @property
    def produce_timeout_s(self) -> float: ...
    def aiokafka_options(self) -> dict[str, Any]: ...
    def kafka_client_options(self) -> dict[str, Any]: ...


class StoreSettings(Protocol):
    """What the Redis stores a role opens (workers.service.stores) reads."""

    @property
    def drift_bucket_s(self) -> int: ...
    @property
    def drift_sample_cap(self) -> int: ...
    @property
    def drift_sample_rate(self) -> float: ...
    @property
    def drift_window_s(self) -> int: ...
    @property
    def index_keep(self) -> int: ...
    @property
    def means_fold_after(self) -> int: ...
    @property
    def means_recent_s(self) -> float: ...
    @property
    def means_window_s(self) -> float: ...
    @property
    def redis_prefix(self) -> str: ...
    @property
    def redis_replica_timeout_s(self) -> float: ...
    def replicas_required(self) -> int: ...


class EncoderSettings(Protocol):
    """What the encoder an embed worker loads (workers.service.embed.load_encoder) reads."""

    @property
    def model(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def pooling(self) -> str: ...
    @property
    def embed_batch_size(self) -> int: ...
    @property
    def token_budget(self) -> int | None: ...
    @property
    def tokenize_workers(self) -> int | None: ...


class EmbedSettings(StoreSettings, Protocol):
    """What the embed role (workers.service.embed.Embedder) reads."""

    @property
    def coherence_reservoir(self) -> int: ...
    @property
    def dedup_ttl_s(self) -> int: ...
    @property
    def language_filter(self) -> bool: ...
    @property
    def prepare_workers(self) -> int: ...


class ScoreSettings(StoreSettings, Protocol):
    """What the score role (workers.service.score.Scorer) reads."""

    @property
    def detector_arl0(self) -> float: ...
    @property
    def detector_at(self) -> tuple[int, str]: ...
    @property
    def detector_reference(self) -> int: ...
    @property
    def event_dedup_window_s(self) -> int: ...
    @property
    def event_key_fields(self) -> tuple[str, ...]: ...
    @property
    def index_dir(self) -> Path: ...
    @property
    def join_max_event_bytes(self) -> int: ...
    @property
    def join_max_pending(self) -> int: ...
    @property
    def join_window_s(self) -> float: ...
    @property
    def k_values(self) -> tuple[int, ...]: ...
    @property
    def max_future_skew_s(self) -> float: ...
    @property
    def max_label_length(self) -> int: ...
    @property
    def max_lateness_s(self) -> float | None: ...
    @property
    def max_recommenders(self) -> int: ...
    @property
    def processing_guarantee(self) -> Literal["at_least_once", "exactly_once"]: ...
    @property
    def r_values(self) -> tuple[int | None, ...]: ...
    @property
    def recommender_allowlist(self) -> tuple[str, ...]: ...
    @property
    def reload_interval_s(self) -> float: ...
    @property
    def thesaurus_source(self) -> Literal["redis", "dir"]: ...
    @property
    def window_seconds(self) -> tuple[int, ...]: ...


class VoteSettings(Protocol):
    """What the audit"s vote log (workers.service.thesaurus_audit.VoteLog) reads."""

    @property
    def broker(self) -> str: ...
    def kafka_client_options(self) -> dict[str, Any]: ...
    @property
    def topic_votes(self) -> str: ...


class AuditSettings(VoteSettings, Protocol):
    """What the per-version audit (workers.service.thesaurus_audit.VersionAudit) reads."""

    @property
    def coherence_k(self) -> int: ...
    @property
    def coherence_min_tweets(self) -> int: ...
    @property
    def coherence_sample(self) -> int: ...
    @property
    def coherence_reservoir(self) -> int: ...
    @property
    def redis_prefix(self) -> str: ...


class IndexSettings(StoreSettings, AuditSettings, Protocol):
    """What the index role (workers.service.index.Indexer) reads, with the audit of each version it
    publishes."""

    @property
    def index_dir(self) -> Path: ...
    @property
    def index_hubness(self) -> str: ...
    @property
    def index_min_changes(self) -> int: ...
    @property
    def index_min_count(self) -> int: ...
    @property
    def index_n_trees(self) -> int: ...
    @property
    def k_values(self) -> tuple[int, ...]: ...
    @property
    def model(self) -> str: ...


def settings_table() -> str:
    """The Markdown table of every setting: the docs site's Configuration page
    (workers/dev/docs_site.py builds it from this)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default
        shown = "(none)" if default is None or default == "" else f"`{default}`"
        rows.append(f"| `REVAL_{name.upper()}` | {shown} | {field.description or ''} |")
    return "\n".join(rows)
