// The voice panel: list voices (GET /v1/voices), speak a text through /v1/audio/speech as streamed
// raw PCM (fetch ReadableStream -> Web Audio) with the time to first audio, add (multipart) and delete.
import { apiFetch } from "./api.js";
import { PcmPlayer } from "./player.js";

export const SPEECH_RATE = 24000;

export async function listVoices() {
  const response = await apiFetch("/v1/voices");
  return response.json();
}

// Speaks `text`; onProgress({firstAudioMs, bytes}) after each chunk. Resolves when the stream ends.
// `options`: more of the request's fields (speed, instruct: an agent's).
export async function speak(player, text, voice, onProgress, options = {}) {
  player.ensure();
  player.stop();
  const t0 = performance.now();
  const response = await apiFetch("/v1/audio/speech", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model: "tts-1", input: text, voice: voice || undefined, response_format: "pcm",
                           sample_rate: SPEECH_RATE, ...options }),
  });
  const rate = Number(response.headers.get("X-Sample-Rate")) || SPEECH_RATE;
  const reader = response.body.getReader();
  const progress = { firstAudioMs: null, bytes: 0 };
  let carry = null; // an odd byte left over from the previous chunk (s16le samples are 2 bytes)
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    let bytes = value;
    if (carry !== null) {
      bytes = new Uint8Array(value.length + 1);
      bytes[0] = carry;
      bytes.set(value, 1);
      carry = null;
    }
    if (bytes.length % 2) {
      carry = bytes[bytes.length - 1];
      bytes = bytes.subarray(0, bytes.length - 1);
    }
    progress.bytes += value.length;
    if (bytes.length) {
      if (progress.firstAudioMs === null) progress.firstAudioMs = performance.now() - t0;
      const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
      const samples = new Float32Array(bytes.length / 2);
      for (let i = 0; i < samples.length; i++) samples[i] = view.getInt16(2 * i, true) / 32768;
      player.play(samples, rate);
    }
    onProgress(progress);
  }
  return progress;
}

export async function addVoice({ name, promptText, file }) {
  const form = new FormData();
  form.set("name", name);
  form.set("prompt_text", promptText);
  form.set("prompt_wav", file, file.name || "prompt.wav");
  const response = await apiFetch("/v1/voices", { method: "POST", body: form });
  return response.json();
}

export async function deleteVoice(name) {
  await apiFetch(`/v1/voices/${encodeURIComponent(name)}`, { method: "DELETE" });
}

export function newPlayer() {
  return new PcmPlayer();
}
