"""A sandbox's AWS client for the SigV4 tests: boto3 as an agent would use it, with
whatever keys the environment gives it (placeholders). Prints one JSON object of results.

Usage: aws_client.py ENDPOINT_S3 ENDPOINT_STS BUCKET ENDPOINT_SQS   (HTTPS_PROXY / AWS_CA_BUNDLE from the environment)
"""

from __future__ import annotations

import hashlib
import json
import sys

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError


def main() -> None:
    s3_url, sts_url, bucket = sys.argv[1:4]
    config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
    s3 = boto3.client("s3", endpoint_url=s3_url, region_name="us-east-1", config=config)
    sts = boto3.client("sts", endpoint_url=sts_url, region_name="us-east-1", config=config)
    out: dict = {}
    try:
        out["identity"] = sts.get_caller_identity()["Arn"]
        s3.create_bucket(Bucket=bucket)
        small = b"hello through the proxy"
        big = hashlib.sha256(b"seed").digest() * (5 * 1024 * 1024 // 32)  # 5 MiB
        s3.put_object(Bucket=bucket, Key="small.txt", Body=small)
        s3.put_object(Bucket=bucket, Key="dir/big name.bin", Body=big)
        s3.upload_fileobj(__import__("io").BytesIO(big * 2), bucket, "multipart.bin",
                          Config=boto3.s3.transfer.TransferConfig(multipart_threshold=8 * 1024 * 1024))  # fmt: skip
        out["keys"] = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
        out["small"] = s3.get_object(Bucket=bucket, Key="small.txt")["Body"].read() == small
        out["big"] = s3.get_object(Bucket=bucket, Key="dir/big name.bin")["Body"].read() == big
        out["multipart"] = s3.get_object(Bucket=bucket, Key="multipart.bin")["Body"].read() == big * 2
        # A non-S3 service signs a hash of its body (no x-amz-content-sha256): 200 KB of it.
        sqs = boto3.client("sqs", endpoint_url=sys.argv[4], region_name="us-east-1", config=config)
        queue = sqs.create_queue(QueueName=bucket)["QueueUrl"]
        message = "m" * 200_000
        sqs.send_message(QueueUrl=queue, MessageBody=message)
        got = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=1)["Messages"][0]["Body"]
        out["sqs"] = got == message
        out["presigned"] = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "small.txt"})
    except ClientError as exc:
        out["error"] = exc.response.get("Error", {}).get("Code", "?")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
