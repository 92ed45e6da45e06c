// Talks to the gateway as a Xiaozhi device would (docs/xiaozhi-protocol.md): OTA POST for the
// WebSocket URL and token, hello with audio_params, binary protocol v1 (one raw Opus packet per
// frame), listen start/stop/detect, abort. Uplink: microphone -> WebCodecs AudioEncoder (Opus,
// 16 kHz mono, 60 ms); downlink: WebCodecs AudioDecoder -> PcmPlayer, with subtitles and emotion.
import { MIC_RATE, Microphone } from "./mic.js";
import { PcmPlayer } from "./player.js";

const EMOJI = {
  neutral: "😶", happy: "🙂", laughing: "😆", funny: "😂", sad: "😔", angry: "😠", crying: "😭",
  loving: "😍", embarrassed: "😳", surprised: "😯", shocked: "😱", thinking: "🤔", winking: "😉",
  cool: "😎", relaxed: "😌", delicious: "🤤", kissy: "😘", confident: "😏", sleepy: "😴",
  silly: "😜", confused: "🙄",
};

function deviceIdentity() {
  let id = sessionStorage.getItem("xz-device-id");
  if (!id) {
    const bytes = crypto.getRandomValues(new Uint8Array(5));
    id = "02:" + [...bytes].map((b) => b.toString(16).padStart(2, "0")).join(":"); // locally administered
    sessionStorage.setItem("xz-device-id", id);
  }
  return { deviceId: id, clientId: crypto.randomUUID() };
}

export class TalkSession {
  constructor(ui) {
    this.ui = ui; // {log(kind, text), state(text), emotion(text), counters(stats), changed()}
    this.ws = null;
    this.sessionId = "";
    this.mode = "auto";
    this.listening = false; // listen start sent and the uplink flows
    this.speaking = false;
    this.player = new PcmPlayer();
    this.mic = new Microphone((block) => this.onMicBlock(block));
    this.encoder = null;
    this.decoder = null;
    this.micTime = 0;
    this.downTime = 0;
    this.stats = { framesSent: 0, framesReceived: 0, framesDecoded: 0, samplesDecoded: 0, turns: 0 };
    this.sentences = [];
    this.stt = [];
  }

  get connected() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  async connect(operatorToken) {
    this.player.ensure();
    const { deviceId, clientId } = deviceIdentity();
    const ota = await fetch("/xiaozhi/ota/", {
      method: "POST",
      headers: { "Content-Type": "application/json", "Device-Id": deviceId, "Client-Id": clientId },
      body: JSON.stringify({ application: { name: "xiaozhi-web-console", version: "1.0.0" }, board: { type: "web-console" } }),
    });
    if (!ota.ok) throw new Error(`OTA answered ${ota.status}`);
    const ws = (await ota.json()).websocket || {};
    const token = operatorToken || ws.token || "";
    // Browsers cannot set headers on a WebSocket: identity and token go in the query (§2.1).
    const url = new URL(ws.url || `${location.origin.replace(/^http/, "ws")}/xiaozhi/v1/`);
    url.searchParams.set("device-id", deviceId);
    url.searchParams.set("client-id", clientId);
    url.searchParams.set("protocol-version", "1");
    if (token) url.searchParams.set("authorization", `Bearer ${token}`);
    this.ui.log("sys", `OTA: ${url.origin}${url.pathname} (device ${deviceId}${token ? ", token" : ""})`);
    await this.open(url.toString());
  }

  open(url) {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url);
      ws.binaryType = "arraybuffer";
      const helloTimer = setTimeout(() => reject(new Error("no server hello within 10 s")), 10000);
      ws.onopen = () => {
        ws.send(JSON.stringify({
          type: "hello", version: 1, transport: "websocket", features: { mcp: false },
          audio_params: { format: "opus", sample_rate: MIC_RATE, channels: 1, frame_duration: 60 },
        }));
      };
      ws.onerror = () => reject(new Error("the WebSocket failed (bad token or server down?)"));
      ws.onclose = (event) => {
        clearTimeout(helloTimer);
        this.ws = null;
        this.listening = this.speaking = false;
        this.mic.stop();
        this.ui.state("disconnected");
        this.ui.log("sys", `socket closed (${event.code})`);
        this.ui.changed();
      };
      ws.onmessage = (event) => {
        if (typeof event.data === "string") {
          let message;
          try { message = JSON.parse(event.data); } catch (_) { return; }
          if (message.type === "hello") {
            clearTimeout(helloTimer);
            this.onHello(message);
            resolve();
          } else {
            this.onMessage(message);
          }
        } else {
          this.onAudio(new Uint8Array(event.data));
        }
      };
      this.ws = ws;
    });
  }

  onHello(hello) {
    this.sessionId = hello.session_id || "";
    const params = hello.audio_params || {};
    const rate = params.sample_rate || 24000;
    this.decoder = new AudioDecoder({
      output: (data) => this.onDecoded(data),
      error: (e) => this.ui.log("sys", `decoder: ${e.message}`),
    });
    this.decoder.configure({ codec: "opus", sampleRate: rate, numberOfChannels: 1 });
    this.ui.log("sys", `connected: session ${this.sessionId}, downlink Opus ${rate} Hz`);
    this.ui.state("idle");
    this.ui.changed();
  }

  send(message) {
    if (this.connected) this.ws.send(JSON.stringify({ session_id: this.sessionId, ...message }));
  }

  onMessage(m) {
    if (m.type === "stt") {
      this.stt.push(m.text);
      this.ui.log("user", m.text);
    } else if (m.type === "llm") {
      if (m.emotion) this.ui.emotion(EMOJI[m.emotion] || m.text || m.emotion, m.emotion);
    } else if (m.type === "tts") {
      if (m.state === "start") {
        this.speaking = true;
        this.stats.turns += 1;
        this.ui.state("speaking");
      } else if (m.state === "sentence_start") {
        this.sentences.push(m.text);
        this.ui.log("bot", m.text);
      } else if (m.state === "stop") {
        this.speaking = false;
        this.afterReply();
      }
    } else if (m.type === "alert") {
      this.ui.log("sys", `alert: ${m.message}`);
    }
  }

  async afterReply() {
    await this.player.drained();
    if (this.speaking || !this.connected) return;
    if (this.mode === "manual" || !this.listening) {
      this.listening = false;
      this.ui.state("idle");
    } else if (this.mode === "auto") {
      this.send({ type: "listen", state: "start", mode: "auto" }); // the device listens again (§4.2)
      this.ui.state("listening");
    } else {
      this.ui.state("listening");
    }
    this.ui.changed();
  }

  onAudio(packet) {
    this.stats.framesReceived += 1;
    if (!this.decoder || this.decoder.state !== "configured" || packet.length === 0) return;
    this.decoder.decode(new EncodedAudioChunk({ type: "key", timestamp: this.downTime, data: packet }));
    this.downTime += 60000;
  }

  onDecoded(data) {
    const samples = new Float32Array(data.numberOfFrames);
    data.copyTo(samples, { planeIndex: 0, format: "f32-planar" });
    this.stats.framesDecoded += 1;
    this.stats.samplesDecoded += samples.length;
    this.player.play(samples, data.sampleRate);
    data.close();
    this.ui.counters(this.stats);
  }

  async startListening(mode) {
    this.mode = mode;
    this.player.ensure();
    if (!this.encoder) {
      this.encoder = new AudioEncoder({
        output: (chunk) => this.onEncoded(chunk),
        error: (e) => this.ui.log("sys", `encoder: ${e.message}`),
      });
      this.encoder.configure({
        codec: "opus", sampleRate: MIC_RATE, numberOfChannels: 1, bitrate: 24000,
        opus: { frameDuration: 60000, complexity: 0 }, // one 60 ms packet per frame, as the firmware
      });
    }
    await this.mic.start();
    if (this.speaking && mode !== "realtime") this.abort();
    this.send({ type: "listen", state: "start", mode });
    this.listening = true;
    this.ui.state("listening");
    this.ui.changed();
  }

  stopListening() {
    if (this.listening) this.send({ type: "listen", state: "stop" });
    this.listening = false;
    this.ui.state(this.speaking ? "speaking" : "idle");
    this.ui.changed();
  }

  // Half duplex (auto, manual): the mic is off while the reply plays, as on a device without AEC.
  get uplinkOpen() {
    if (!this.listening || !this.connected) return false;
    return this.mode === "realtime" || (!this.speaking && this.player.pending() === 0);
  }

  onMicBlock(block) {
    if (!this.encoder || this.encoder.state !== "configured") return;
    const data = new AudioData({
      format: "f32-planar", sampleRate: MIC_RATE, numberOfFrames: block.length, numberOfChannels: 1,
      timestamp: this.micTime, data: block,
    });
    this.micTime += (block.length / MIC_RATE) * 1e6;
    this.encoder.encode(data);
    data.close();
  }

  onEncoded(chunk) {
    if (!this.uplinkOpen) return;
    const packet = new Uint8Array(chunk.byteLength);
    chunk.copyTo(packet);
    this.ws.send(packet);
    this.stats.framesSent += 1;
    this.ui.counters(this.stats);
  }

  sendText(text) {
    this.player.ensure();
    if (this.speaking) this.abort();
    this.send({ type: "listen", state: "detect", text });
  }

  abort() {
    this.send({ type: "abort" });
    this.player.stop();
  }

  close() {
    if (this.ws) this.ws.close(1000);
  }
}

