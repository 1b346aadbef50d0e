"""What TensorFlow's C++ code prints to the terminal, bypassing Python's logging: the lines the
command-line tools drop unless --verbose (see train.cli). No side effects on import."""

import contextlib
import os
import re
import sys
import tempfile


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


# What TensorFlow's C++ libraries print while they load, before TF_CPP_MIN_LOG_LEVEL applies
# (tensorflow/tensorflow#100442): absl's banner and INFO lines stamped "I0000 00:00:...". On a
# machine without an NVIDIA driver also the error it logs when it first lists the devices
# ("failed call to cuInit: ... UNKNOWN ERROR (303)"), which train.cli makes happen while it loads.
NO_NVIDIA_DRIVER = not os.path.exists("/dev/nvidiactl")
_ABSL_BANNER = r"WARNING: All log messages before absl::InitializeLog"
_STARTUP_NOISE = re.compile(_ABSL_BANNER + r"|I0000 "
                            + (r"|.*\] failed call to cuInit" if NO_NVIDIA_DRIVER else ""))

# What the TFLite converter prints on every conversion, none of it about the model; with
# TensorFlow 2.19 also absl's banner and C++ INFO lines (devices.cc, ...), whatever
# TF_CPP_MIN_LOG_LEVEL says.
_CONVERTER_NOISE = re.compile(r"W0000 .*\] (Ignored output_format|Ignored drop_control_dependency"
                              r"|Skipping runtime version metadata)|fully_quantize: |"
                              + _ABSL_BANNER + r"|I\d{4} [\d:.]+\s+\d+ \w+\.cc:\d+\] ")


def startup_noise_dropped():
    return lines_dropped(_STARTUP_NOISE)


def converter_noise_dropped():
    """For a TFLite conversion: its routine lines dropped, unless the command has --verbose."""
    if verbose_in(sys.argv):
        return contextlib.nullcontext()
    return lines_dropped(_CONVERTER_NOISE)


@contextlib.contextmanager
def lines_dropped(noise):
    """Sends file descriptor 2 to a file meanwhile, then writes back the lines that the regular
    expression `noise` does not match."""
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
                if not noise.match(line):
                    sys.stderr.write(line)
            sys.stderr.flush()
