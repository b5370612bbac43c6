// Which pages a credential may use: the control plane's policy (apiserver/policy.py), seen from
// the console. A page a credential cannot use is not offered.

export type PageId =
  | "playground"
  | "fleet"
  | "models"
  | "cluster"
  | "tenants"
  | "usage"
  | "costs";

export interface Who {
  /** null: a gateway with no control plane (e.g. `fleet-gateway --demo`); no sign-in. */
  role: string | null;
  id?: string;
  tenantId?: string | null;
  projectId?: string | null;
}

export const PAGES: { id: PageId; path: string; label: string }[] = [
  { id: "playground", path: "/playground", label: "Playground" },
  { id: "fleet", path: "/fleet", label: "Fleet" },
  { id: "models", path: "/models", label: "Models" },
  { id: "cluster", path: "/cluster", label: "Cluster" },
  { id: "tenants", path: "/tenants", label: "Tenants & keys" },
  { id: "usage", path: "/usage", label: "Usage" },
  { id: "costs", path: "/costs", label: "Costs" },
];

const BY_ROLE: Record<string, PageId[]> = {
  admin: ["playground", "fleet", "models", "cluster", "tenants", "usage", "costs"],
  finance: ["playground", "cluster", "tenants", "usage", "costs"],
  tenant: ["playground", "tenants", "usage"],
  metrics: ["playground", "fleet"],
};

export function pagesFor(who: Who): PageId[] {
  if (who.role === null) return ["playground", "fleet"];
  return BY_ROLE[who.role] ?? ["playground"];
}

/** The page a path shows, if the credential may use it; else the first page it may. */
export function pageAt(path: string, who: Who): PageId {
  const allowed = pagesFor(who);
  const found = PAGES.find((p) => path === p.path || path.startsWith(p.path + "/"));
  return found && allowed.includes(found.id) ? found.id : allowed[0];
}

/** Admins write; finance and tenants read (and finance manages rates and closes months). */
export function canWrite(who: Who, what: "tenants" | "costs" | "models"): boolean {
  if (who.role === "admin") return true;
  return what === "costs" && who.role === "finance";
}
