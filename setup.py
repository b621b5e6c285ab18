"""Installs the ESA telemetry pipeline; also Beam's ``--setup_file`` for remote workers."""

from setuptools import find_packages, setup

setup(
    name="esa-telemetry",
    version="0.1.0",
    description="Encode-Shuffle-Analyze telemetry with local and shuffled differential privacy on Apache Beam",
    python_requires=">=3.11",
    packages=find_packages(
        include=["privacy*", "schemas*", "simulators*", "transforms*", "pipelines*"]
    ),
    package_data={"schemas": ["*.avsc", "recipes/*.json", "*.json"]},
    include_package_data=True,
    install_requires=[
        "apache-beam>=2.60",
        "numpy",
        "fastavro",
        "pyarrow",
        "google-crc32c",
        # Root-finding, binomial tails and statistical tests: reimplementing these would be worse.
        "scipy",
        # PNG pictures of histograms and reconstructed images.
        "matplotlib",
    ],
    extras_require={
        "images": ["scikit-image"],
        # polars: only the baseline our Avro reader is measured against in `make bench`.
        "test": ["pytest", "pytest-xdist", "avro", "mpmath", "ruff", "polars"],
    },
    entry_points={"console_scripts": ["esa=pipelines.cli:main"]},
)
