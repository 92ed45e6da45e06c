// The microphone as 60 ms blocks of 16 kHz mono Float32 samples (the browser resamples: the
// AudioContext runs at 16 kHz, an AudioWorklet cuts the blocks).
export const MIC_RATE = 16000;
export const FRAME_SAMPLES = 960; // 60 ms

export class Microphone {
  constructor(onBlock) {
    this.onBlock = onBlock;
    this.ctx = null;
    this.stream = null;
  }

  async start() {
    if (this.ctx) return;
    this.stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: false, autoGainControl: false },
    });
    this.ctx = new AudioContext({ sampleRate: MIC_RATE });
    await this.ctx.audioWorklet.addModule("/console/assets/mic-worklet.js");
    const source = this.ctx.createMediaStreamSource(this.stream);
    const node = new AudioWorkletNode(this.ctx, "mic-capture", {
      processorOptions: { frame: FRAME_SAMPLES },
    });
    node.port.onmessage = (event) => this.onBlock(event.data);
    const mute = this.ctx.createGain(); // keeps the worklet pulled without playing the mic back
    mute.gain.value = 0;
    source.connect(node).connect(mute).connect(this.ctx.destination);
    if (this.ctx.state === "suspended") await this.ctx.resume();
  }

  async stop() {
    if (!this.ctx) return;
    for (const track of this.stream.getTracks()) track.stop();
    await this.ctx.close();
    this.ctx = null;
    this.stream = null;
  }
}

// A recording as a 16-bit mono WAV Blob (for voice prompts). Written here because browsers have no WAV
// encoder (MediaRecorder gives WebM/Opus); a 44-byte header over int16 samples.
export function wavBlob(blocks, sampleRate) {
  const total = blocks.reduce((n, b) => n + b.length, 0);
  const view = new DataView(new ArrayBuffer(44 + total * 2));
  const text = (offset, s) => [...s].forEach((c, i) => view.setUint8(offset + i, c.charCodeAt(0)));
  text(0, "RIFF"); view.setUint32(4, 36 + total * 2, true); text(8, "WAVE");
  text(12, "fmt "); view.setUint32(16, 16, true); view.setUint16(20, 1, true); view.setUint16(22, 1, true);
  view.setUint32(24, sampleRate, true); view.setUint32(28, sampleRate * 2, true);
  view.setUint16(32, 2, true); view.setUint16(34, 16, true);
  text(36, "data"); view.setUint32(40, total * 2, true);
  let offset = 44;
  for (const block of blocks) {
    for (const x of block) {
      view.setInt16(offset, Math.max(-1, Math.min(1, x)) * 32767, true);
      offset += 2;
    }
  }
  return new Blob([view.buffer], { type: "audio/wav" });
}
