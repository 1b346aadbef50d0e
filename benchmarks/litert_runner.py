"""One LiteRT runner for the benchmarks that time or score TFLite files."""

from ai_edge_litert.interpreter import Interpreter


def tflite_runner(model, batch, threads):
    """`run(images) -> outputs` of a TFLite model (a file path, or the flatbuffer's bytes) with
    its input resized to `batch` images, on `threads` threads (XNNPack)."""
    if isinstance(model, bytes):
        interpreter = Interpreter(model_content=model, num_threads=threads)
    else:
        interpreter = Interpreter(model_path=model, num_threads=threads)
    detail = interpreter.get_input_details()[0]
    interpreter.resize_tensor_input(detail["index"], [batch, *detail["shape"][1:]])
    interpreter.allocate_tensors()
    output = interpreter.get_output_details()[0]["index"]

    def run(images):
        interpreter.set_tensor(detail["index"], images)
        interpreter.invoke()
        return interpreter.get_tensor(output)

    return run
