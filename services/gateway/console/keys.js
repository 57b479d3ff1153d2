// The signed-in user's own Agent keys (#/keys): list (GET /api/workshop/keys, revoked and
// expired ones included), create (POST /api/workshop/keys: a name, the scope "workshop"
// (optionally limited to cameras) or "footage:read" (cameras required), a lifetime in
// days; the secret is shown once, here, and never again), revoke (DELETE
// /api/workshop/keys/{id}, confirmed). A user may grant only those two scopes: processor
// and admin keys are an operator's, and the page says so.
import { ApiError, api, currentSession } from "./api.js";
import { h, scrollBox, show } from "./dom.js";
import { sessionEnded } from "./nav.js";
import { accountBar, age } from "./runs.js";

const SCOPES = { workshop: "workshop: workflows, runs, review (an agent)", footage_read: "footage:read: images of the cameras named" };

function scopeText(scopes) {
  return scopes.map((s) => {
    const name = s.scope === "footage_read" ? "footage:read" : s.scope;
    return s.camera_ids.length ? `${name} (${s.camera_ids.join(", ")})` : `${name} (every camera)`;
  }).join("; ");
}

function state(key, now) {
  if (key.revoked_at) return `revoked ${age(key.revoked_at, now)}`;
  if (key.expires_at && Date.parse(key.expires_at) <= now) return "expired";
  return key.expires_at ? `active, expires ${new Date(key.expires_at).toISOString().slice(0, 10)}` : "active";
}

export async function keysView({ main, account, alive }) {
  const session = await currentSession();
  const catalog = await api("GET", "/api/workshop/catalog");
  if (!alive()) return;
  accountBar(account, session);
  const list = h("div", { id: "keys-list" });
  const notice = h("p", { id: "keys-notice", role: "status" });
  const error = h("p", { id: "keys-error", class: "error", role: "alert", hidden: true });
  const secretBox = h("div", { id: "new-secret", class: "notice", hidden: true });

  async function refresh() {
    const answer = await api("GET", "/api/workshop/keys", { query: { include_revoked: "true", page_size: "1000" } });
    const now = Date.now();
    const rows = answer.keys.map((key) => {
      const active = !key.revoked_at && !(key.expires_at && Date.parse(key.expires_at) <= now);
      return h("tr", { "data-key-id": key.key_id },
        h("th", { scope: "row", text: key.name }),
        h("td", {}, h("code", { text: key.key_id })),
        h("td", { text: scopeText(key.scopes) }),
        h("td", { text: state(key, now) }),
        h("td", { text: key.last_used_at ? age(key.last_used_at, now) : "never" }),
        h("td", {}, active ? h("button", {
          type: "button", class: "danger small", text: "Revoke", "aria-label": `Revoke key ${key.name}`,
          onclick: () => revoke(key),
        }) : ""));
    });
    list.replaceChildren(answer.keys.length === 0
      ? h("p", { id: "keys-empty", text: "You have no Agent keys yet." })
      : scrollBox("Your Agent keys", h("table", { id: "keys" },
        h("caption", { text: "Your Agent keys, newest first" }),
        h("thead", {}, h("tr", {}, ["Name", "Key id", "Scope", "State", "Last used", "Action"].map((t) => h("th", { scope: "col", text: t })))),
        h("tbody", {}, rows))));
  }

  async function revoke(key) {
    if (!window.confirm(`Revoke key "${key.name}" (${key.key_id})? It stops working at once, and runs it created lose their authority.`)) return;
    error.hidden = true;
    try {
      await api("DELETE", `/api/workshop/keys/${encodeURIComponent(key.key_id)}`);
      notice.textContent = `Key "${key.name}" is revoked.`;
      await refresh();
    } catch (failure) {
      if (failure instanceof ApiError && failure.status === 401) {
        sessionEnded();
        return;
      }
      error.textContent = failure.message;
      error.hidden = false;
    }
  }

  const name = h("input", { id: "key-name", maxlength: "100", required: true, autocomplete: "off" });
  const scope = h("select", { id: "key-scope" }, Object.entries(SCOPES).map(([value, text]) => h("option", { value, text })));
  const cameras = h("fieldset", { class: "field checks" }, h("legend", { text: "Cameras (none: every camera, for workshop)" }),
    catalog.cameras.map((c) => h("span", { class: "choice" },
      h("input", { type: "checkbox", id: `key-camera-${c.camera_id}`, value: c.camera_id }),
      h("label", { for: `key-camera-${c.camera_id}`, text: c.name && c.name !== c.camera_id ? `${c.name} (${c.camera_id})` : c.camera_id }))));
  const days = h("input", { id: "key-days", type: "number", min: "1", max: "365", step: "1", value: "90", inputmode: "numeric" });
  const submit = h("button", { type: "submit", text: "Create key" });
  const form = h("form", {
    id: "create-key", class: "panel key-form", "aria-labelledby": "create-key-title",
    onsubmit: async (event) => {
      event.preventDefault();
      error.hidden = true;
      secretBox.hidden = true;
      const cameraIds = [...cameras.querySelectorAll("input:checked")].map((c) => c.value);
      const body = {
        name: name.value.trim(),
        scopes: [{ scope: scope.value, camera_ids: cameraIds }],
        ttl: Number(days.value) * 86400,
      };
      submit.disabled = true;
      try {
        const created = await api("POST", "/api/workshop/keys", { body });
        secretBox.replaceChildren(
          h("p", {}, h("strong", { text: `Key "${created.key.name}" created. ` }),
            "Copy its secret now: it is shown only this once."),
          h("label", { for: "key-secret", text: "Secret (send it as Authorization: Bearer …)" }),
          h("input", { id: "key-secret", readonly: true, value: created.secret, class: "secret", spellcheck: "false" }));
        secretBox.hidden = false;
        form.reset();
        await refresh();
        document.getElementById("key-secret").select();
        document.getElementById("key-secret").focus();
      } catch (failure) {
        if (failure instanceof ApiError && failure.status === 401) {
        sessionEnded();
        return;
      }
        error.textContent = failure.message;
        error.hidden = false;
      } finally {
        submit.disabled = false;
      }
    },
  }, h("h2", { id: "create-key-title", text: "Create a key" }),
  h("div", { class: "field" }, h("label", { for: "key-name", text: "Name" }), name),
  h("div", { class: "field" }, h("label", { for: "key-scope", text: "Scope" }), scope),
  cameras,
  h("div", { class: "field" }, h("label", { for: "key-days", text: "Lifetime (days, 1 to 365)" }), days),
  submit);

  await refresh();
  if (!alive()) return;
  const heading = h("h1", { tabindex: "-1", text: "Agent keys" });
  show(main, heading,
    h("p", { class: "muted", text: "Keys let an agent or a script act for you over /v1 with a bearer secret. You may grant " +
      "\"workshop\" and \"footage:read\"; processor (workshop:run) and admin keys are an operator's to create." }),
    secretBox, notice, error, form, list);
  document.title = "Agent keys · Workshop";
  heading.focus();
}
