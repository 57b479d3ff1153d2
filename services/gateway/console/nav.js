// Moving between the console's views, which live in the URL's fragment (#/login,
// #/runs?workflow=ID, #/<view>/<id> for one resource's page): app.js renders the view
// on every `hashchange`.

export const VIEW_NAMES = [
  "login", "runs", "run", "review", "summary", "queue", "buckets", "workflows", "workflow", "models",
  "runtimes", "keys", "cameras", "datasets", "version",
];
export const DEFAULT_VIEW = "runs";

export function parseRoute(fragment) {
  const path = fragment.startsWith("#/") ? fragment.slice(2) : "";
  const [where, search = ""] = path.split("?", 2);
  const [name, id = ""] = where.split("/", 2);
  if (!VIEW_NAMES.includes(name)) {
    return { name: DEFAULT_VIEW, id: "", params: new URLSearchParams() };
  }
  return { name, id: decodeSegment(id), params: new URLSearchParams(search) };
}

function decodeSegment(segment) {
  try {
    return decodeURIComponent(segment);
  } catch {
    return segment; // a malformed %-escape: the id as typed, which the API then refuses
  }
}

/** Where the login page sends the user after signing in: a view of this console only. */
export function safeNext(value) {
  if (!value || !value.startsWith("/") || parseRoute(`#${value}`).name === "login") {
    return `#/${DEFAULT_VIEW}`;
  }
  return `#${value}`;
}

export function go(fragment) {
  if (window.location.hash === fragment) window.dispatchEvent(new HashChangeEvent("hashchange"));
  else window.location.hash = fragment;
}

/** To the login page, and back here after signing in; `notice` (login.js) says why. */
export function toLogin(notice) {
  const here = window.location.hash.startsWith("#/") ? window.location.hash.slice(1) : "";
  const params = new URLSearchParams(notice ? { notice } : {});
  if (here && parseRoute(`#${here}`).name !== "login") params.set("next", here);
  const query = params.toString();
  go(query ? `#/login?${query}` : "#/login");
}

/** To the login page, because the session expired or was revoked; back here after. */
export function sessionEnded() {
  toLogin("ended");
}
