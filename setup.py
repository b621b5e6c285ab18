"""Installs the ESA telemetry pipeline; also Beam's ``--setup_file`` for remote workers."""

from setuptools import find_namespace_packages, setup

# The layers (DESIGN.md), bottom up; tests/test_layers.py checks their imports point down.
LAYERS = ("privacy", "schemas", "simulators", "transforms", "pipelines", "experiments")
CRATES = ("prio3", "avro_blocks")

setup(
    name="esa-telemetry",
    version="0.1.0",
    description="Encode-Shuffle-Analyze telemetry with local and shuffled differential privacy on Apache Beam",
    python_requires=">=3.11",
    # Namespace discovery also lists data-only directories (schemas/recipes) as packages, so
    # their files are declared package data and setuptools has nothing to warn about.
    # schemas/prio3 and schemas/avro_blocks are Rust crates with their own builds (the Makefile
    # installs them), not packages.
    packages=find_namespace_packages(
        include=[f"{layer}*" for layer in LAYERS],
        exclude=[f"schemas.{crate}{tail}" for crate in CRATES for tail in ("", ".*")],
    ),
    package_data={"schemas": ["*.avsc", "*.json"], "schemas.recipes": ["*.json"]},
    install_requires=[
        "apache-beam>=2.60",
        "numpy",
        "fastavro",
        "pyarrow",
        "google-crc32c",
        # Deflate blocks of Avro containers: Intel's ISA-L (python-isal, a zlib-compatible
        # module) inflates them about 1.7x as fast as zlib, the reader's largest cost after the
        # record walk; the bytes are the same (zlib stays the fallback).
        "isal",
        # Snappy blocks of Avro containers (--codec snappy; fastavro reads them with it too).
        "cramjam",
        # Root-finding, binomial tails and statistical tests: reimplementing these would be worse.
        "scipy",
        # PNG pictures of histograms and reconstructed images.
        "matplotlib",
        # Privacy-loss distributions and their composition (connect-the-dots, FFT convolution):
        # a maintained, peer-reviewed accountant beats re-deriving discretization error bounds.
        "dp-accounting",
        # RFC 9180 HPKE and X25519 for sealed reports: vetted crypto, never our own primitives.
        "cryptography>=46",
        # esa collect and the simulated fleet's uploads: aiohttp is a maintained asyncio HTTP
        # server and client in one package (one event loop holds thousands of slow connections
        # without a thread each); TLS stays with the standard library's ssl.
        "aiohttp>=3.9",
        # The progress line of long stages (pipelines/commandline/progress.py).
        "tqdm",
    ],
    extras_require={
        "images": ["scikit-image"],
        # pipelines.api's Results.to_pandas(): results as DataFrames (Arrow tables without it).
        "pandas": ["pandas"],
        # esa train: the digits dataset ships inside scikit-learn's wheel (no download), and its
        # LogisticRegression is the non-private optimum we compare LDP-SGD with.
        "train": ["scikit-learn"],
        # polars: only the baseline our Avro reader is measured against in `make bench`.
        # scikit-learn: the esa train tests read its bundled digits.
        # pynacl: benchmarks/bench_sealing.py measures libsodium sealed boxes beside HPKE.
        # pandas: the README's Python API example (pipelines/api.py) runs in the tests.
        "test": [
            "pytest",
            "pytest-xdist",
            "avro",
            "mpmath",
            "ruff",
            "polars",
            "scikit-learn",
            "pynacl",
            "pandas",
        ],
    },
    entry_points={"console_scripts": ["esa=pipelines.commandline.main:entry"]},
)
