// Moving between the console's views, which live in the URL's fragment (#/login,
// #/runs?workflow=ID): app.js renders the view on every `hashchange`.

export const VIEW_NAMES = ["login", "runs"];
export const DEFAULT_VIEW = "runs";

export function parseRoute(fragment) {
  const path = fragment.startsWith("#/") ? fragment.slice(2) : "";
  const [name, search = ""] = path.split("?", 2);
  return {
    name: VIEW_NAMES.includes(name) ? name : DEFAULT_VIEW,
    params: new URLSearchParams(search),
  };
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

/** To the login page, because the session is missing, expired or revoked; back here after. */
export function sessionEnded() {
  const here = window.location.hash.startsWith("#/") ? window.location.hash.slice(1) : "";
  const params = new URLSearchParams({ notice: "ended" });
  if (here && parseRoute(`#${here}`).name !== "login") params.set("next", here);
  go(`#/login?${params}`);
}
