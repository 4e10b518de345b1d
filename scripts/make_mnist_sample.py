#!/usr/bin/env python3
"""Cuts a small MNIST sample for the tests and the README's quick run: the first N training
and M test images of the standard files, written as gzipped IDX in the same format.

    python3 scripts/make_mnist_sample.py ../shared/data/mnist data/mnist-sample 3000 1000
"""
import gzip
import struct
import sys


def cut(src, dst, n):
    with gzip.open(src, "rb") as f:
        data = f.read()
    ndims = data[3]
    dims = list(struct.unpack(">" + "I" * ndims, data[4:4 + 4 * ndims]))
    per = 1
    for d in dims[1:]:
        per *= d
    head = 4 + 4 * ndims
    dims[0] = min(n, dims[0])
    out = data[:4] + struct.pack(">" + "I" * ndims, *dims) + data[head:head + dims[0] * per]
    # mtime 0: the same bytes on every run
    with open(dst, "wb") as f:
        with gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as g:
            g.write(out)


def main():
    src, dst, ntrain, ntest = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    for name, n in [("train-images-idx3-ubyte", ntrain), ("train-labels-idx1-ubyte", ntrain),
                    ("t10k-images-idx3-ubyte", ntest), ("t10k-labels-idx1-ubyte", ntest)]:
        cut(f"{src}/{name}.gz", f"{dst}/{name}.gz", n)


if __name__ == "__main__":
    main()
