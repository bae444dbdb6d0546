"""The names object stores give their buckets, as rules that say what is wrong (None when the name is valid).

Written out from the stores' documentation: no maintained Python package checks them (boto3 checks only the
characters, and only when a request is made).
"""

from __future__ import annotations

import re


def s3_bucket(name: str) -> str | None:
    """AWS S3 User Guide, "General purpose bucket naming rules" (bucketnamingrules.html)."""
    if not 3 <= len(name) <= 63:
        return "has a bucket name of other than 3-63 characters (S3's bucket naming rules)"
    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*[a-z0-9]", name):
        return (
            "has a bucket name S3 refuses: lowercase letters, digits, '.' and '-' only, starting and ending with a "
            "letter or digit"
        )
    if ".." in name:
        return "has a bucket name with two adjacent periods, which S3 refuses"
    if IPV4.fullmatch(name):
        return "has a bucket name formatted as an IP address, which S3 refuses"
    for prefix in _S3_RESERVED_PREFIXES:
        if name.startswith(prefix):
            return f"has a bucket name starting with {prefix}, a prefix S3 reserves"
    for suffix in _S3_RESERVED_SUFFIXES:
        if name.endswith(suffix):
            return f"has a bucket name ending in {suffix}, a suffix S3 reserves (aliases, directory buckets)"
    return None


def gcs_bucket(name: str) -> str | None:
    """Cloud Storage, "Bucket names" (cloud.google.com/storage/docs/buckets#naming)."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*[a-z0-9]", name):
        return (
            "has a bucket name Cloud Storage refuses: lowercase letters, digits, '-', '_' and '.', starting and "
            "ending with a letter or digit"
        )
    if len(name) > (222 if "." in name else 63) or len(name) < 3:
        return "has a bucket name of other than 3-63 characters (222 with dots), which Cloud Storage refuses"
    if any(not 1 <= len(part) <= 63 for part in name.split(".")):
        return "has a bucket name with an empty part or a part over 63 characters between dots"
    if IPV4.fullmatch(name):
        return "has a bucket name formatted as an IP address, which Cloud Storage refuses"
    if name.startswith("goog") or "google" in name:
        return "has a bucket name starting with goog or containing google, which Cloud Storage refuses"
    return None


IPV4 = re.compile(r"[0-9]{1,3}(\.[0-9]{1,3}){3}")
_S3_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_S3_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
BUCKET_RULES = {"s3": s3_bucket, "gs": gcs_bucket}
