// Runs in the AudioWorklet thread: posts the microphone's samples (at the context's rate) in blocks
// of `frame` samples (60 ms at 16 kHz by default), the size of one uplink Opus frame.
class MicCapture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.frame = (options.processorOptions && options.processorOptions.frame) || 960;
    this.buffer = new Float32Array(this.frame);
    this.filled = 0;
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (channel) {
      let offset = 0;
      while (offset < channel.length) {
        const n = Math.min(channel.length - offset, this.frame - this.filled);
        this.buffer.set(channel.subarray(offset, offset + n), this.filled);
        this.filled += n;
        offset += n;
        if (this.filled === this.frame) {
          this.port.postMessage(this.buffer);
          this.buffer = new Float32Array(this.frame);
          this.filled = 0;
        }
      }
    }
    return true;
  }
}

registerProcessor("mic-capture", MicCapture);
