import { lazy, Suspense, useCallback, useEffect, useMemo, useState } from "react";
import { Alert, App as AntApp, Button, Card, ConfigProvider, Form, Input, Layout, Menu, Spin, Tag, Typography } from "antd";
import { api, ApiError } from "./lib/api";
import { PAGES, pageAt, pagesFor, type PageId, type Who } from "./lib/access";
import { navigate, SessionContext, storedToken, storeToken, type Session } from "./session";

const pages: Record<PageId, React.LazyExoticComponent<() => React.JSX.Element>> = {
  playground: lazy(() => import("./pages/Playground")),
  fleet: lazy(() => import("./pages/Fleet")),
  models: lazy(() => import("./pages/Models")),
  cluster: lazy(() => import("./pages/Cluster")),
  tenants: lazy(() => import("./pages/Tenants")),
  usage: lazy(() => import("./pages/Usage")),
  costs: lazy(() => import("./pages/Costs")),
};

type State =
  | { kind: "checking" }
  | { kind: "signed-out"; error?: string }
  | { kind: "in"; token: string | null; who: Who };

/** Who a token is: the control plane's whoami; null role when no control plane is reachable
 * through this gateway (the demo), where the playground needs no sign-in. */
async function identify(token: string | null): Promise<State> {
  try {
    const who = await api<Who>("/api/v1/whoami", { token });
    return { kind: "in", token, who };
  } catch (error) {
    if (error instanceof ApiError && error.code === "no_control_plane") {
      return { kind: "in", token, who: { role: null } };
    }
    if (error instanceof ApiError && error.status === 401) {
      return { kind: "signed-out", error: token ? "That credential was not accepted." : undefined };
    }
    return { kind: "signed-out", error: error instanceof Error ? error.message : String(error) };
  }
}

function usePath(): string {
  const [path, setPath] = useState(window.location.pathname);
  useEffect(() => {
    const onPop = () => setPath(window.location.pathname);
    window.addEventListener("popstate", onPop);
    return () => window.removeEventListener("popstate", onPop);
  }, []);
  return path;
}

export function App() {
  const [state, setState] = useState<State>({ kind: "checking" });
  const path = usePath();

  useEffect(() => {
    void identify(storedToken()).then(setState);
  }, []);

  const signIn = useCallback(async (token: string) => {
    const next = await identify(token.trim());
    if (next.kind === "in") storeToken(token.trim());
    setState(next);
  }, []);

  const signOut = useCallback(() => {
    storeToken(null);
    setState({ kind: "signed-out" });
  }, []);

  return (
    <ConfigProvider theme={{ token: { colorPrimary: "#1f6feb", borderRadius: 6 } }}>
      <AntApp>
      {state.kind === "checking" && <Spin fullscreen />}
      {state.kind === "signed-out" && <SignIn error={state.error} onSignIn={signIn} />}
      {state.kind === "in" && (
        <Console session={{ token: state.token, who: state.who, signOut }} path={path} />
      )}
      </AntApp>
    </ConfigProvider>
  );
}

function SignIn({ error, onSignIn }: { error?: string; onSignIn: (token: string) => Promise<void> }) {
  const [busy, setBusy] = useState(false);
  return (
    <Layout style={{ minHeight: "100vh", alignItems: "center", justifyContent: "center" }}>
      <Card title="Fleet console" style={{ width: 420 }}>
        <Typography.Paragraph type="secondary">
          Sign in with an admin or finance credential of the control plane, or with a tenant's API
          key (which sees its own tenant only).
        </Typography.Paragraph>
        {error && <Alert type="error" showIcon message={error} style={{ marginBottom: 16 }} />}
        <Form
          layout="vertical"
          onFinish={async ({ token }: { token: string }) => {
            setBusy(true);
            await onSignIn(token);
            setBusy(false);
          }}
        >
          <Form.Item name="token" label="Credential" rules={[{ required: true }]}>
            <Input.Password autoFocus placeholder="fsc_… or fk_…" data-testid="token" />
          </Form.Item>
          <Button type="primary" htmlType="submit" loading={busy} block>
            Sign in
          </Button>
        </Form>
      </Card>
    </Layout>
  );
}

function Console({ session, path }: { session: Session; path: string }) {
  const allowed = pagesFor(session.who);
  const current = pageAt(path, session.who);
  const Page = pages[current];
  const items = useMemo(
    () =>
      PAGES.filter((p) => allowed.includes(p.id)).map((p) => ({
        key: p.id,
        label: (
          <a
            href={p.path}
            onClick={(e) => {
              e.preventDefault();
              navigate(p.path);
            }}
          >
            {p.label}
          </a>
        ),
      })),
    [allowed],
  );
  const who = session.who;
  return (
    <SessionContext.Provider value={session}>
      <Layout style={{ minHeight: "100vh" }}>
        <Layout.Sider width={200} theme="light" style={{ borderRight: "1px solid #eee" }}>
          <div style={{ padding: "16px 20px", fontWeight: 600, fontSize: 18 }}>Fleet</div>
          <Menu mode="inline" selectedKeys={[current]} items={items} data-testid="nav" />
        </Layout.Sider>
        <Layout>
          <Layout.Header
            style={{ background: "#fff", display: "flex", justifyContent: "flex-end", gap: 12, alignItems: "center" }}
          >
            {who.role === null ? (
              <Tag color="orange">no control plane: playground and fleet only</Tag>
            ) : (
              <>
                <Tag color="blue" data-testid="role">
                  {who.role}
                  {who.tenantId ? ` · ${who.tenantId}` : ""}
                </Tag>
                <Button size="small" onClick={session.signOut}>
                  Sign out
                </Button>
              </>
            )}
          </Layout.Header>
          <Layout.Content style={{ padding: 24 }}>
            <Suspense fallback={<Spin />}>
              <Page key={current} />
            </Suspense>
          </Layout.Content>
        </Layout>
      </Layout>
    </SessionContext.Provider>
  );
}
