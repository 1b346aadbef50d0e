"""The lines TensorFlow's C++ code writes to file descriptor 2 whatever TF_CPP_MIN_LOG_LEVEL says;
the command-line tools drop them unless --verbose (see train.console.cli). No side effects on
import."""

import contextlib
import os
import re
import sys
import tempfile

# While its libraries load (tensorflow/tensorflow#100442): absl's banner and C++ INFO lines; on a
# machine without an NVIDIA driver, the error of its first device listing (train.console.cli lists
# them then). On every TFLite conversion: routine warnings and "fully_quantize: ...". When a file
# does not decode or a SavedModel cannot be written, the op's own lines (libjpeg's "Improper
# call to JPEG library in state 201", the failed SaveV2 op's warnings): the error that follows
# names the file and the reason.
NO_NVIDIA_DRIVER = not os.path.exists("/dev/nvidiactl")
_NOISE = re.compile(r"WARNING: All log messages before absl::InitializeLog"
                    r"|I\d{4} [\d:.]+\s+\d+ [\w-]+\.(cc|h):\d+\] "  # C++ INFO, not ours (.py)
                    r"|W\d{4} .*\] (Ignored output_format|Ignored drop_control_dependency"
                    r"|Skipping runtime version metadata)|fully_quantize: "
                    r"|Improper call to JPEG library in state \d+"
                    r"|W\d{4} .*\] Local rendezvous is aborting with status: INVALID_ARGUMENT: "
                    r"(jpeg::Uncompress failed|Input is empty|Unknown image file format)"
                    r"|W\d{4} .*\] (OP_REQUIRES failed at save_restore_v2_ops\.cc:\d+ : |Local "
                    r"rendezvous is aborting with status: )[A-Z_]+: .*\.tempstate\d+; "
                    + (r"|E\d{4} .*\] failed call to cuInit" if NO_NVIDIA_DRIVER else ""))


def verbose_in(argv):
    """Whether `argv` turns --verbose on, read before absl parses the flags."""
    verbose = False
    for arg in argv[1:]:
        if arg == "--":
            break
        name, has_value, value = arg.partition("=")
        if name.lstrip("-") == "verbose":
            verbose = not has_value or value.lower() in ("true", "t", "1")
        elif name.lstrip("-") == "noverbose":
            verbose = False
    return verbose


@contextlib.contextmanager
def dropped():
    """Unless the command has --verbose: file descriptor 2 goes to a file meanwhile, then its
    lines are written back, less those above."""
    if verbose_in(sys.argv):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines(keepends=True):
                if not _NOISE.match(line):
                    sys.stderr.write(line)
            sys.stderr.flush()
