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

export class SignedOut extends ApiError {
  /** No live session, learnt from GET /api/session (which answers 200 either way, so a
   * signed-out page logs no failed request). `ended`: a session ended, the cookie's (it
   * expired, was signed out or revoked) or this page's, rather than none ever. */
  constructor(ended) {
    super(401, { message: "Sign in first.", reason: "SIGNED_OUT" }, null);
    this.ended = ended;
  }
}

export class Unreachable extends Error {
  constructor() {
    super("The gateway cannot be reached; check the connection and try again.");
  }
}

let csrfToken = ""; // the session's, while this page holds one
let hadSession = false; // this page held a session (so a missing one has ended)
let session = null; // the latest checkSession(): what currentSession() answers

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

/** Who the cookie belongs to, asked anew (the router does, before each view); keeps its
 * CSRF token. Rejects with SignedOut without a live session. */
export function checkSession() {
  session = readSession();
  return session;
}

/** The session the router checked for the view being shown (asked now if none was). */
export function currentSession() {
  return session || checkSession();
}

async function readSession() {
  const answer = await api("GET", "/api/session");
  if (!answer.signed_in) {
    csrfToken = "";
    throw new SignedOut(answer.ended || hadSession);
  }
  csrfToken = answer.csrf_token;
  hadSession = true;
  return answer;
}

export async function signIn(userId, password) {
  const answer = await api("POST", "/api/session", { body: { user_id: userId, password } });
  csrfToken = answer.csrf_token;
  hadSession = true;
  session = null;
  return answer;
}

export async function signOut() {
  try {
    await api("DELETE", "/api/session");
  } finally {
    csrfToken = "";
    session = null;
  }
}
