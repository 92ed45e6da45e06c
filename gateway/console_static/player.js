// Plays mono Float32 PCM blocks back to back as they arrive (Web Audio), at any sample rate.
export class PcmPlayer {
  constructor() {
    this.ctx = null;
    this.cursor = 0;
    this.sources = new Set();
    this.samplesPlayed = 0;
  }

  // Create (or resume) the AudioContext; call from a user gesture so autoplay rules allow it.
  ensure() {
    if (!this.ctx) this.ctx = new AudioContext();
    if (this.ctx.state === "suspended") this.ctx.resume();
    return this.ctx;
  }

  play(samples, sampleRate) {
    const ctx = this.ensure();
    if (!samples.length) return;
    const buffer = ctx.createBuffer(1, samples.length, sampleRate);
    buffer.copyToChannel(samples, 0);
    const source = ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(ctx.destination);
    const start = Math.max(this.cursor, ctx.currentTime + 0.05);
    source.start(start);
    this.cursor = start + buffer.duration;
    this.samplesPlayed += samples.length;
    this.sources.add(source);
    source.onended = () => this.sources.delete(source);
  }

  // Seconds of queued audio still to play.
  pending() {
    return this.ctx ? Math.max(0, this.cursor - this.ctx.currentTime) : 0;
  }

  // Resolves once everything queued has played.
  drained() {
    return new Promise((resolve) => setTimeout(resolve, this.pending() * 1000));
  }

  stop() {
    for (const source of this.sources) {
      try { source.stop(); } catch (_) { /* already stopped */ }
    }
    this.sources.clear();
    this.cursor = 0;
  }
}
