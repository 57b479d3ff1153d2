// The console's one way to the gateway: same-origin fetches of /api with the session
// cookie (HttpOnly: this code never sees the secret), the CSRF token on every write.

export class ApiError extends Error {
  /** An answer of the gateway's error catalog (docs/http-api.md#errors). */
  constructor(status, body, retryAfter) {
    super((body && body.message) || `The gateway answered ${status}.`);
    this.status = status;
    this.reason = (body && body.reason) || "";
    this.details = (body && body.details) || {};
    this.retryAfter = retryAfter;
  }
}

export class Unreachable extends Error {
  constructor() {
    super("The gateway cannot be reached; check the connection and try again.");
  }
}

let csrfToken = "";

export async function api(method, path, { query, body } = {}) {
  const url = new URL(path, window.location.origin);
  for (const [name, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== "") url.searchParams.set(name, value);
  }
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && csrfToken) headers["X-CSRF-Token"] = csrfToken;
  let response;
  try {
    response = await fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "same-origin",
      cache: "no-store",
    });
  } catch {
    throw new Unreachable();
  }
  if (response.status === 204) return null;
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    const retry = Number.parseInt(response.headers.get("Retry-After") || "", 10);
    throw new ApiError(response.status, data, Number.isFinite(retry) ? retry : null);
  }
  return data;
}

/** Who the cookie belongs to (401 without a live session); keeps its CSRF token. */
export async function currentSession() {
  const session = await api("GET", "/api/session");
  csrfToken = session.csrf_token;
  return session;
}

export async function signIn(userId, password) {
  const session = await api("POST", "/api/session", { body: { user_id: userId, password } });
  csrfToken = session.csrf_token;
  return session;
}

export async function signOut() {
  try {
    await api("DELETE", "/api/session");
  } finally {
    csrfToken = "";
  }
}
