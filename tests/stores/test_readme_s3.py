"""The README's object-store snippet, run against the loopback S3 server."""

import pathlib
import re
import shutil

import pyckpt
from pyckpt.testing import servers

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_readme_s3_snippet(seaweed_options, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    monkeypatch.setenv("S3_ENDPOINT_URL", seaweed_options["endpoint_url"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed_options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed_options["secret"])
    servers.make_bucket("s3", seaweed_options, "my-bucket")
    namespace: dict = {}
    try:
        for i, code in enumerate(blocks):
            if "init_process_group" in code:
                continue
            exec(compile(code, f"README.md block {i}", "exec"), namespace)
            if "s3://" in code:
                break
    finally:
        shutil.rmtree("/tmp/pyckpt-guide", ignore_errors=True)
        shutil.rmtree("/tmp/run", ignore_errors=True)
    so = {"endpoint_url": seaweed_options["endpoint_url"]}
    assert pyckpt.latest_checkpoint("s3://my-bucket/run", storage_options=so).endswith("ckpt-100")
    assert namespace["embedding"].shape == (4, 4)
