// The API key (kept in sessionStorage) and fetch with it as a Bearer token.
const KEY = "xz-api-key";

export function apiKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// fetch() with the key; a non-2xx answer throws ApiError with the API's message.
export async function apiFetch(path, options = {}) {
  const headers = new Headers(options.headers || {});
  const key = apiKey();
  if (key) headers.set("Authorization", `Bearer ${key}`);
  const response = await fetch(path, { ...options, headers });
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      const body = await response.json();
      message = (body.error && body.error.message) || body.detail || message;
    } catch (_) { /* not JSON */ }
    if (response.status === 401) message = `API key needed or wrong: ${message}`;
    throw new ApiError(response.status, message);
  }
  return response;
}
