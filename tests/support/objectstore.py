"""A real S3-compatible server for the object-storage tests: moto's standalone server, a separate process spoken to
over HTTP by the same client code users run (s3fs, botocore), with S3's conditional writes (If-None-Match,
If-Match). Clients find it through the standard environment (AWS_ENDPOINT_URL), as they would find MinIO."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from contextlib import contextmanager
from typing import Iterator


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class S3Server:
    def __init__(self, endpoint: str, process: subprocess.Popen):
        self.endpoint, self.process = endpoint, process
        self.env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "raytrain-test",
                    "AWS_SECRET_ACCESS_KEY": "raytrain-test-secret", "AWS_DEFAULT_REGION": "us-east-1"}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"])

    def new_bucket(self) -> str:
        name = f"raytrain-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


@contextmanager
def running_s3_server() -> Iterator[S3Server]:
    """Start the server on a free port, wait until it answers, and stop it afterwards."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).read()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"moto's S3 server did not start on {endpoint}")
            time.sleep(0.1)
    try:
        yield S3Server(endpoint, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
