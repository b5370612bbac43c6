// The Tenants & keys page's writes, for credentials that may make them (access.canWrite): a
// tenant's or project's rate limits (PATCH), budget rules created, changed in place (PATCH: limit
// and window) and deleted after confirming. Every 400 shows on the field it names (apiForm).
import { useState } from "react";
import { Alert, App, Button, Form, Input, InputNumber, Modal, Popconfirm, Select, Space } from "antd";
import { api } from "../lib/api";
import { useApiForm } from "../lib/apiForm";
import { SearchSelect } from "../lib/SearchSelect";
import { useSession } from "../session";

export interface Limited {
  id: string;
  requestLimit: number | null;
  tokenLimit: number | null;
}

export interface Rule {
  id: string;
  scopeKind: "tenant" | "project";
  scopeId: string;
  dimension: string;
  limit: number;
  window: string;
  windowSeconds: number;
}

const DIMENSIONS = ["tokens_total", "tokens_input", "tokens_output", "tokens_cached", "tokens_fresh", "units"];
const WINDOW_HELP = "N + s, m, h, d, w or mo (30 days): 5h, 7d, 1mo";

function FormProblem({ problem }: { problem: string | undefined }) {
  return problem ? <Alert type="error" showIcon message={problem} style={{ marginBottom: 12 }} data-testid="form-problem" /> : null;
}

/** Edit a tenant's or project's requests/min and tokens/min (empty: unlimited). */
export function EditLimits({ what, row, onDone }: { what: "tenants" | "projects"; row: Limited; onDone: () => void }) {
  const { token } = useSession();
  const [open, setOpen] = useState(false);
  const edit = useApiForm<{ requestLimit: number | null; tokenLimit: number | null }>(["requestLimit", "tokenLimit"]);
  const save = (v: { requestLimit?: number | null; tokenLimit?: number | null }) =>
    edit.submit(
      () => api(`/api/v1/${what}/${row.id}`, { method: "PATCH", token, body: { requestLimit: v.requestLimit ?? null, tokenLimit: v.tokenLimit ?? null } }),
      () => (setOpen(false), onDone()),
    );
  return (
    <>
      <Button size="small" onClick={() => (edit.clear(), setOpen(true))} data-testid={`limits-${row.id}`}>
        Edit limits
      </Button>
      <Modal destroyOnHidden open={open} title={`Rate limits of ${row.id}`} okText="Save" confirmLoading={edit.busy} onOk={() => edit.form.submit()} onCancel={() => setOpen(false)}>
        <FormProblem problem={edit.problem} />
        <Form form={edit.form} layout="vertical" preserve={false} initialValues={{ requestLimit: row.requestLimit, tokenLimit: row.tokenLimit }} onFinish={save}>
          <Form.Item name="requestLimit" label="Requests per minute" extra="empty: no limit">
            <InputNumber precision={0} style={{ width: 200 }} data-testid="edit-request-limit" />
          </Form.Item>
          <Form.Item name="tokenLimit" label="Tokens per minute" extra="empty: no limit">
            <InputNumber precision={0} style={{ width: 200 }} data-testid="edit-token-limit" />
          </Form.Item>
        </Form>
      </Modal>
    </>
  );
}

/** A new budget rule on a tenant or a project. */
export function CreateRule({ reloadOn, onDone }: { reloadOn: { tenant: unknown; project: unknown }; onDone: () => void }) {
  const { token } = useSession();
  const create = useApiForm<Omit<Rule, "id" | "windowSeconds">>(["scopeKind", "scopeId", "dimension", "limit", "window"]);
  const kind = Form.useWatch("scopeKind", create.form) ?? "tenant";
  return (
    <>
      <FormProblem problem={create.problem} />
      <Form
        form={create.form}
        layout="inline"
        style={{ marginBottom: 16, rowGap: 8 }}
        initialValues={{ scopeKind: "tenant", dimension: "tokens_total", window: "1d" }}
        onFinish={(v) => create.submit(() => api("/api/v1/budget-rules", { method: "POST", token, body: v }), () => (create.form.resetFields(["limit"]), onDone()))}
      >
        <Form.Item name="scopeKind">
          <Select style={{ width: 110 }} options={[{ value: "tenant" }, { value: "project" }]} onChange={() => create.form.setFieldValue("scopeId", undefined)} />
        </Form.Item>
        <Form.Item name="scopeId" rules={[{ required: true, message: "pick a scope" }]}>
          <SearchSelect key={kind} path={kind === "tenant" ? "/api/v1/tenants" : "/api/v1/projects"} token={token} reloadOn={kind === "tenant" ? reloadOn.tenant : reloadOn.project} style={{ width: 200 }} placeholder={kind} data-testid="rule-scope" />
        </Form.Item>
        <Form.Item name="dimension">
          <Select style={{ width: 150 }} options={DIMENSIONS.map((d) => ({ value: d }))} />
        </Form.Item>
        <Form.Item name="limit" rules={[{ required: true, message: "a limit" }]}>
          <InputNumber precision={0} placeholder="limit" style={{ width: 140 }} data-testid="rule-limit" />
        </Form.Item>
        <Form.Item name="window" rules={[{ required: true }]} tooltip={WINDOW_HELP}>
          <Input placeholder="window, e.g. 1d" style={{ width: 120 }} data-testid="rule-window" />
        </Form.Item>
        <Button htmlType="submit" type="primary" loading={create.busy} data-testid="create-rule">
          Create rule
        </Button>
      </Form>
    </>
  );
}

/** Change a rule's limit or window (PATCH), or delete it after confirming. */
export function RuleActions({ rule, onDone }: { rule: Rule; onDone: () => void }) {
  const { token } = useSession();
  const { message } = App.useApp();
  const [open, setOpen] = useState(false);
  const edit = useApiForm<{ limit: number; window: string }>(["limit", "window"]);
  async function remove() {
    try {
      await api(`/api/v1/budget-rules/${rule.id}`, { method: "DELETE", token });
      onDone();
    } catch (e) {
      message.error(e instanceof Error ? e.message : String(e));
    }
  }
  return (
    <Space>
      <Button size="small" onClick={() => (edit.clear(), setOpen(true))} data-testid={`edit-rule-${rule.scopeId}-${rule.window}`}>
        Edit
      </Button>
      <Popconfirm title={`Delete this ${rule.window} ${rule.dimension} rule on ${rule.scopeId}? Its limit stops applying.`} okText="Delete" okButtonProps={{ danger: true }} onConfirm={remove}>
        <Button size="small" danger data-testid={`delete-rule-${rule.scopeId}-${rule.window}`}>
          Delete
        </Button>
      </Popconfirm>
      <Modal destroyOnHidden open={open} title={`Budget rule on ${rule.scopeKind} ${rule.scopeId} (${rule.dimension})`} okText="Save" confirmLoading={edit.busy} onOk={() => edit.form.submit()} onCancel={() => setOpen(false)}>
        <FormProblem problem={edit.problem} />
        <Form
          form={edit.form}
          layout="vertical"
          preserve={false}
          initialValues={{ limit: rule.limit, window: rule.window }}
          onFinish={(v) => edit.submit(() => api(`/api/v1/budget-rules/${rule.id}`, { method: "PATCH", token, body: v }), () => (setOpen(false), onDone()))}
        >
          <Form.Item name="limit" label="Limit" rules={[{ required: true }]}>
            <InputNumber precision={0} style={{ width: 200 }} data-testid="edit-rule-limit" />
          </Form.Item>
          <Form.Item name="window" label="Window" extra={WINDOW_HELP} rules={[{ required: true }]}>
            <Input style={{ width: 200 }} data-testid="edit-rule-window" />
          </Form.Item>
        </Form>
      </Modal>
    </Space>
  );
}
