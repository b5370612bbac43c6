import { useState } from "react";
import { Alert, App, Button, Card, Form, Input, InputNumber, Modal, Popconfirm, Progress, Space, Table, Tabs, Tag, Typography } from "antd";
import { api, type List } from "../lib/api";
import { canWrite } from "../lib/access";
import { useLoad } from "../lib/useLoad";
import { Pager, usePaged } from "../lib/usePaged";
import { SearchSelect } from "../lib/SearchSelect";
import { useSession } from "../session";
import { CreateRule, EditLimits, RuleActions, type Rule } from "./TenantsEditing";

interface Tenant {
  id: string;
  name: string;
  requestLimit: number | null;
  tokenLimit: number | null;
  active: boolean;
}
interface Project extends Tenant {
  tenantId: string;
}
interface ApiKey {
  id: string;
  projectId: string;
  label: string;
  prefix: string;
  createdAt: string;
  lastUsedAt: string | null;
  revokedAt: string | null;
  secret?: string;
}
interface UsageRow {
  requests: number;
  tokensInput: number;
  tokensOutput: number;
  tokensCached: number;
  tokensFresh: number;
  units: number;
}

const DIMENSION: Record<string, (r: UsageRow) => number> = {
  tokens_total: (r) => r.tokensInput + r.tokensOutput,
  tokens_input: (r) => r.tokensInput,
  tokens_output: (r) => r.tokensOutput,
  tokens_cached: (r) => r.tokensCached,
  tokens_fresh: (r) => r.tokensFresh,
  units: (r) => r.units,
};

/** How much of a rule's window is used, from the usage rollups (the window ending now). */
function RuleUse({ rule }: { rule: Rule }) {
  const { token } = useSession();
  const from = new Date(Date.now() - rule.windowSeconds * 1000).toISOString();
  const scope = rule.scopeKind === "tenant" ? `tenantId=${encodeURIComponent(rule.scopeId)}` : `projectId=${encodeURIComponent(rule.scopeId)}`;
  const used = useLoad(
    () => api<List<UsageRow>>(`/api/v1/usage?groupBy=model&${scope}&from=${encodeURIComponent(from)}`, { token }),
    [rule.id, rule.windowSeconds],
  );
  if (used.error) return <Typography.Text type="secondary">–</Typography.Text>;
  const value = (used.data?.data ?? []).reduce((n, r) => n + (DIMENSION[rule.dimension]?.(r) ?? 0), 0);
  return <Progress data-testid={`used-${rule.id}`} status={value >= rule.limit ? "exception" : "normal"} size="small" percent={Math.min(100, Math.round((100 * value) / rule.limit))} format={() => `${value.toLocaleString()} / ${rule.limit.toLocaleString()}`} style={{ width: 260 }} />;
}

export default function Tenants() {
  const session = useSession();
  const { token, who } = session;
  const { message } = App.useApp();
  const admin = canWrite(who, "tenants");
  // tenants, projects and keys page on the server (a tenant's key reads its one tenant)
  const tenants = usePaged<Tenant>(who.role === "tenant" ? `/api/v1/tenants/${who.tenantId}` : "/api/v1/tenants", token);
  const projects = usePaged<Project>("/api/v1/projects", token);
  const keys = usePaged<ApiKey>("/api/v1/keys", token);
  const rules = usePaged<Rule>("/api/v1/budget-rules", token); // each row loads its own "used of the window"
  const [issued, setIssued] = useState<ApiKey>();
  const tenantRows: Tenant[] = tenants.data ? ("data" in tenants.data ? tenants.data.data : [tenants.data as unknown as Tenant]) : [];

  async function act(path: string, method: string, body: unknown, done: () => void) {
    try {
      const result = await api<ApiKey>(path, { method, token, body });
      done();
      return result;
    } catch (e) {
      message.error(e instanceof Error ? e.message : String(e));
      return undefined;
    }
  }

  const errors = [tenants.error, projects.error, keys.error, rules.error].filter(Boolean);
  return (
    <Space direction="vertical" size="large" style={{ width: "100%" }}>
      <Typography.Title level={3}>Tenants & keys</Typography.Title>
      {errors.map((e) => (
        <Alert key={e} type="error" showIcon message={e} />
      ))}
      <Tabs
        items={[
          {
            key: "tenants",
            label: "Tenants",
            children: (
              <Card>
                {admin && (
                  <Form layout="inline" style={{ marginBottom: 16 }} onFinish={(v) => act("/api/v1/tenants", "POST", v, tenants.reload)}>
                    <Form.Item name="id" rules={[{ required: true }]}><Input placeholder="id" data-testid="tenant-id" /></Form.Item>
                    <Form.Item name="name" rules={[{ required: true }]}><Input placeholder="name" data-testid="tenant-name" /></Form.Item>
                    <Form.Item name="tokenLimit"><InputNumber min={1} placeholder="tokens/min" /></Form.Item>
                    <Button htmlType="submit" type="primary" data-testid="create-tenant">Create tenant</Button>
                  </Form>
                )}
                <Table data-testid="tenants" rowKey="id" size="small" pagination={false} dataSource={tenantRows} loading={tenants.loading && !tenants.data}
                  columns={[
                    { title: "Tenant", dataIndex: "id" },
                    { title: "Name", dataIndex: "name" },
                    { title: "Requests/min", dataIndex: "requestLimit", render: (v) => v ?? "–" },
                    { title: "Tokens/min", dataIndex: "tokenLimit", render: (v) => v ?? "–" },
                    { title: "State", dataIndex: "active", render: (a: boolean) => <Tag color={a ? "green" : "default"}>{a ? "active" : "suspended"}</Tag> },
                    ...(admin ? [{ title: "", render: (_: unknown, t: Tenant) => <EditLimits what="tenants" row={t} onDone={tenants.reload} /> }] : []),
                  ]} />
                <Pager list={tenants} testId="tenants-pager" />
              </Card>
            ),
          },
          {
            key: "projects",
            label: "Projects",
            children: (
              <Card>
                {admin && (
                  <Form layout="inline" style={{ marginBottom: 16 }} onFinish={(v) => act("/api/v1/projects", "POST", v, projects.reload)}>
                    <Form.Item name="tenantId" rules={[{ required: true }]}>
                      <SearchSelect path="/api/v1/tenants" token={token} reloadOn={tenants.data} style={{ width: 180 }} placeholder="tenant" />
                    </Form.Item>
                    <Form.Item name="name" rules={[{ required: true }]}><Input placeholder="project name" /></Form.Item>
                    <Button htmlType="submit" type="primary">Create project</Button>
                  </Form>
                )}
                <Table rowKey="id" size="small" pagination={false} dataSource={projects.rows}
                  columns={[
                    { title: "Project", dataIndex: "id" },
                    { title: "Requests/min", dataIndex: "requestLimit", render: (v) => v ?? "–" },
                    { title: "Tokens/min", dataIndex: "tokenLimit", render: (v) => v ?? "–" },
                    { title: "State", dataIndex: "active", render: (a: boolean) => <Tag color={a ? "green" : "default"}>{a ? "active" : "suspended"}</Tag> },
                    ...(admin ? [{ title: "", render: (_: unknown, p: Project) => <EditLimits what="projects" row={p} onDone={projects.reload} /> }] : []),
                  ]} />
                <Pager list={projects} testId="projects-pager" />
              </Card>
            ),
          },
          {
            key: "keys",
            label: "API keys",
            children: (
              <Card>
                {admin && (
                  <Form layout="inline" style={{ marginBottom: 16 }}
                    onFinish={async (v) => {
                      const key = await act("/api/v1/keys", "POST", v, keys.reload);
                      if (key) setIssued(key);
                    }}>
                    <Form.Item name="projectId" rules={[{ required: true }]}>
                      <SearchSelect path="/api/v1/projects" token={token} reloadOn={projects.data} style={{ width: 220 }} placeholder="project" data-testid="key-project" />
                    </Form.Item>
                    <Form.Item name="label" rules={[{ required: true }]}><Input placeholder="label" data-testid="key-label" /></Form.Item>
                    <Button htmlType="submit" type="primary" data-testid="create-key">Create key</Button>
                  </Form>
                )}
                <Table data-testid="keys" rowKey="id" size="small" pagination={false} dataSource={keys.rows}
                  columns={[
                    { title: "Key", dataIndex: "prefix", render: (p: string) => <Typography.Text code>{p}…</Typography.Text> },
                    { title: "Project", dataIndex: "projectId" },
                    { title: "Label", dataIndex: "label" },
                    { title: "Last used", dataIndex: "lastUsedAt", render: (t: string | null) => (t ? new Date(t).toLocaleString() : "never") },
                    {
                      title: "",
                      render: (_, k) =>
                        k.revokedAt ? <Tag>revoked</Tag> : (
                          <Popconfirm title={`Revoke ${k.prefix}…? Requests with it fail at once.`} okText="Revoke" okButtonProps={{ danger: true }}
                            onConfirm={() => act(`/api/v1/keys/${k.id}`, "DELETE", undefined, keys.reload)}>
                            <Button size="small" danger data-testid={`revoke-${k.label}`}>Revoke</Button>
                          </Popconfirm>
                        ),
                    },
                  ]} />
                <Pager list={keys} testId="keys-pager" />
              </Card>
            ),
          },
          {
            key: "budgets",
            label: "Budget rules",
            children: (
              <Card>
                {admin && (
                  <CreateRule
                    reloadOn={{ tenant: tenants.data, project: projects.data }}
                    onDone={rules.reload}
                  />
                )}
                <Table data-testid="rules" rowKey="id" size="small" pagination={false} dataSource={rules.rows}
                  columns={[
                    { title: "Scope", render: (_, r) => `${r.scopeKind} ${r.scopeId}` },
                    { title: "Dimension", dataIndex: "dimension" },
                    { title: "Window", dataIndex: "window" },
                    { title: "Used of the limit", render: (_, r) => <RuleUse rule={r} /> },
                    ...(admin ? [{ title: "", render: (_: unknown, r: Rule) => <RuleActions rule={r} onDone={rules.reload} /> }] : []),
                  ]} />
                <Pager list={rules} testId="rules-pager" />
              </Card>
            ),
          },
        ]}
      />
      <Modal destroyOnHidden open={issued !== undefined} title="API key created" onOk={() => setIssued(undefined)} onCancel={() => setIssued(undefined)} cancelButtonProps={{ style: { display: "none" } }} okText="I have copied it">
        <Typography.Paragraph>This is the only time the secret is shown. Copy it now; the control plane keeps only its hash.</Typography.Paragraph>
        <Typography.Paragraph code copyable data-testid="secret">{issued?.secret}</Typography.Paragraph>
      </Modal>
    </Space>
  );
}
