"""Audio and prepared samples as objects in S3 (WHISPERQ_STORAGE=s3://BUCKET/PREFIX), or in any
store that speaks its API: every host with the credentials reaches them, with no shared disk.

Only boto3 and AWS's own configuration are used (AWS_ENDPOINT_URL, AWS_DEFAULT_REGION, the
credentials chain), so what runs against a local S3-compatible server runs on S3 unchanged.
A reference `audio/ab/<id>` is the key `PREFIX/audio/ab/<id>`.

The sealed bytes (models.security.sealed) go up with boto3's managed transfer, in parts above
its multipart threshold. Reads are HTTP range requests, pinned to the object's ETag (If-Match),
of what is asked (a sealed chunk) or, reading on from the last one, a block ahead: a decoder
seeks (an MP4's index at its end) without downloading the whole object. Key rotation writes an
object again only if it is still the one that was read (a conditional write on its ETag): a job
deleted meanwhile is not brought back.

An object is whole or absent, so nothing half-written is ever listed; a multipart upload cut
short by a crash leaves parts that the bucket's lifecycle rule (AbortIncompleteMultipartUpload)
removes, and an object whose row was never written is an orphan for retention's sweep.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from config import ConfigError
from config.settings import S3_INSTALL, s3_location
from models.security.sealed import (
    CHUNK_BYTES,
    HEADER_MAX,
    DecryptedFile,
    EncryptedWriter,
    RandomAccess,
    header_key_id,
)
from models.storage.base import Storage, StoredFile, check_ref

if TYPE_CHECKING:
    from boto3.s3.transfer import TransferConfig
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef
    from sqlalchemy.orm import Session

BLOCK = 1 << 20  # read ahead when reading on; also the reseal's copy buffer
_GONE = {404}
_CHANGED = {409, 412}  # a conditional request lost to a concurrent write, or a precondition that failed


def _status(exc: Exception) -> int | None:
    """The HTTP status of a botocore ClientError (None for any other error)."""
    response: Any = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None


def _client_error() -> type[Exception]:
    from botocore.exceptions import ClientError

    return ClientError


def new_client(owner: str | None = None) -> S3Client:
    """An S3 client configured by AWS's own variables and files only (AWS_ENDPOINT_URL,
    AWS_DEFAULT_REGION, the credentials chain); ConfigError saying what to install without boto3.
    With `owner` (WHISPERQ_S3_EXPECTED_OWNER), every request that names a bucket says which
    account must own it (ExpectedBucketOwner): S3 answers 403 for a bucket of another."""
    try:
        import boto3
    except ImportError:
        raise ConfigError(f"reading S3 needs boto3, which is not installed: {S3_INSTALL}") from None
    client = boto3.session.Session().client("s3")
    if owner is not None:

        def expect(params: dict[str, Any], model: Any, **_kwargs: Any) -> None:
            if "Bucket" in params and "ExpectedBucketOwner" in model.input_shape.members:
                params.setdefault("ExpectedBucketOwner", owner)

        client.meta.events.register("before-parameter-build.s3", expect)
    return client


class ProcessClient:
    """One S3 client per process, made on first use: a client (its connection pool) is never
    carried across a fork."""

    def __init__(self, owner: str | None = None) -> None:
        self.owner = owner
        self._made: tuple[int, S3Client] | None = None
        self._lock = threading.Lock()

    def get(self) -> S3Client:
        with self._lock:
            if self._made is None or self._made[0] != os.getpid():
                self._made = (os.getpid(), new_client(self.owner))
            return self._made[1]


class S3Object(RandomAccess):
    """One object's bytes as stored (sealed), seekable, each read an HTTP range request for
    what is asked, or a BLOCK ahead when reading on from the last request. Pinned to the ETag
    it was opened at: an object deleted or replaced meanwhile reads as gone
    (FileNotFoundError), never as a splice of two versions. Also the `source` DecryptedFile
    reads at offsets (`read_at`)."""

    def __init__(self, client: S3Client, bucket: str, key: str, name: str):
        super().__init__()
        self.client, self.bucket, self.key, self.name = client, bucket, key, name
        self._pos = 0
        self._block: tuple[int, bytes] = (-1, b"")
        try:
            head = client.head_object(Bucket=bucket, Key=key)
        except _client_error() as exc:
            self.close()
            if _status(exc) in _GONE:
                raise FileNotFoundError(f"{name} is not in s3://{bucket}/{key}") from None
            raise
        self.size: int = head["ContentLength"]
        self.etag: str = head["ETag"]

    def _fetch(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of this version of the object."""
        try:
            reply = self.client.get_object(
                Bucket=self.bucket, Key=self.key, Range=f"bytes={start}-{end - 1}", IfMatch=self.etag
            )
        except _client_error() as exc:
            if _status(exc) in _GONE | _CHANGED:
                raise FileNotFoundError(f"{self.name} was deleted or replaced while it was read") from None
            raise
        body = reply["Body"]
        try:
            return body.read()
        finally:
            body.close()

    def read_at(self, offset: int, length: int) -> bytes:
        out = bytearray()
        while length > 0 and offset < self.size:
            start, data = self._block
            if not start <= offset < start + len(data):
                reading_on = offset == start + len(data)
                end = min(self.size, offset + max(length, BLOCK if reading_on else 0))
                start, data = offset, self._fetch(offset, end)
                self._block = (start, data)
                if not data:
                    break
            piece = data[offset - start : offset - start + length]
            out += piece
            offset, length = offset + len(piece), length - len(piece)
        return bytes(out)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read_at(self._pos, len(view))
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def close(self) -> None:
        self._block = (-1, b"")
        super().close()


class S3Storage(Storage):
    """References are keys under the prefix of WHISPERQ_STORAGE's bucket."""

    kind = "s3"
    page_size = 1000  # keys per ListObjectsV2 request (S3's most)

    def __init__(self, root: str | Path, url: str, transfer: TransferConfig | None = None, owner: str | None = None):
        super().__init__(root)
        self.url = url
        self.bucket, self.prefix = s3_location(url)
        try:
            from boto3.s3.transfer import TransferConfig
        except ImportError:
            raise ConfigError(
                f"WHISPERQ_STORAGE={url} keeps audio in S3 through boto3, which is not installed: {S3_INSTALL}"
            ) from None
        # boto3's managed transfer: multipart above its threshold (8 MiB), parts in parallel.
        self.transfer = transfer or TransferConfig()
        self._client = ProcessClient(owner)

    @property
    def client(self) -> S3Client:
        """This process's S3 client, configured by AWS's own variables and files (new_client)."""
        return self._client.get()

    def key(self, ref: str) -> str:
        """The object key of a reference (a name the service chose: check_ref)."""
        return self._under(check_ref(ref))

    def _under(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _ref(self, key: str) -> str:
        return key[len(self.prefix) + 1 :] if self.prefix else key

    def _place(self, tmp: Path, ref: str, session: Session | None) -> None:
        # No transaction spans the bucket and the database: a caller that fails to write the
        # row deletes the object (models.jobs.operations), and retention sweeps what a crash left.
        self.client.upload_file(str(tmp), self.bucket, self.key(ref), Config=self.transfer)
        Path(tmp).unlink(missing_ok=True)

    def _object(self, ref: str) -> S3Object:
        return S3Object(self.client, self.bucket, self.key(ref), f"stored file {ref}")

    def _open(self, ref: str) -> BinaryIO:
        source = self._object(ref)
        return io.BufferedReader(DecryptedFile(source, what=f"stored file {ref}", ref=ref), buffer_size=CHUNK_BYTES)

    def _exists(self, ref: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self.key(ref))
        except _client_error() as exc:
            if _status(exc) in _GONE:
                return False
            raise
        return True

    def delete(self, ref: str) -> None:
        if self.owns(ref):
            self.client.delete_object(Bucket=self.bucket, Key=self.key(ref))  # none there: S3 answers 204 all the same

    def listing(self, folders: tuple[str, ...] = ("audio", "prepared"), parts: bool = False) -> Iterator[StoredFile]:
        # An object is whole or absent: there are no parts to list (see the module's docstring).
        pages = self.client.get_paginator("list_objects_v2")
        for folder in folders:
            for page in pages.paginate(
                Bucket=self.bucket, Prefix=self._under(folder) + "/", PaginationConfig={"PageSize": self.page_size}
            ):
                for item in page.get("Contents", []):
                    if item["Key"].endswith("/"):
                        continue  # a console's "folder" placeholder, not a file
                    yield StoredFile(self._ref(item["Key"]), item["LastModified"].timestamp())

    def key_id(self, ref: str) -> str | None:
        what = f"stored file {ref}"
        with self._object(ref) as source:
            head = source.read_at(0, HEADER_MAX)
        return header_key_id(head, what)

    def reseal(self, ref: str) -> bool:
        try:
            source = self._object(ref)
        except FileNotFoundError:
            return False
        tmp = self.tmp_dir / f"reseal-{uuid.uuid4().hex}"
        try:
            try:
                with (
                    io.BufferedReader(DecryptedFile(source, what=f"stored file {ref}", ref=ref), CHUNK_BYTES) as src,
                    EncryptedWriter(tmp, ref=ref) as out,
                ):
                    shutil.copyfileobj(src, out, BLOCK)
            except FileNotFoundError:
                return False
            return self._replace_if_unchanged(tmp, source.key, source.etag)
        finally:
            source.close()
            tmp.unlink(missing_ok=True)

    def _replace_if_unchanged(self, tmp: Path, key: str, etag: str) -> bool:
        """Write `tmp` over the object `key` only if it is still the version `etag` (a
        conditional write, If-Match): False if it was deleted or replaced meanwhile. In parts
        above the multipart threshold, the condition on the completing request."""
        try:
            if tmp.stat().st_size <= self.transfer.multipart_threshold:
                with open(tmp, "rb") as fh:
                    self.client.put_object(Bucket=self.bucket, Key=key, Body=fh, IfMatch=etag)
            else:
                self._put_in_parts(tmp, key, etag)
        except _client_error() as exc:
            if _status(exc) in _GONE | _CHANGED:
                return False
            raise
        return True

    def _put_in_parts(self, tmp: Path, key: str, etag: str) -> None:
        upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        try:
            done: list[CompletedPartTypeDef] = []
            with open(tmp, "rb") as fh:
                while block := fh.read(self.transfer.multipart_chunksize):
                    number = len(done) + 1
                    part = self.client.upload_part(
                        Bucket=self.bucket, Key=key, UploadId=upload, PartNumber=number, Body=block
                    )
                    done.append({"ETag": part["ETag"], "PartNumber": number})
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": done}, IfMatch=etag
            )
        except BaseException:
            with contextlib.suppress(Exception):  # else the lifecycle rule removes what is left
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload)
            raise
